// Test harness: a real nats-server with JetStream and the real dispatcher,
// both built from the repository's Go module (no docker, no global installs).

import { execFile, spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { randomBytes } from "node:crypto";
import { connect, headers, type NatsConnection } from "@nats-io/transport-node";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";

const run = promisify(execFile);
/** The repository's root: this file is sdk/typescript/dist/test/harness.js. */
export const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), "../../../..");
/** Where buildBinaries puts nats-server and dispatcher. */
export const binDir = process.env.TOOLRELAY_TS_BIN ?? join(tmpdir(), "toolrelay-ts-bin");

let built: Promise<void> | undefined;
/** buildBinaries builds nats-server and the dispatcher once per process (go's cache makes repeats quick). */
export function buildBinaries(): Promise<void> {
  built ??= (async () => {
    await run("go", ["build", "-o", join(binDir, "nats-server"), "github.com/nats-io/nats-server/v2"], { cwd: repoRoot });
    await run("go", ["build", "-o", join(binDir, "dispatcher"), "./cmd/dispatcher"], { cwd: repoRoot });
  })();
  return built;
}

export async function freePort(): Promise<number> {
  return new Promise((res, rej) => {
    const s = createServer();
    s.once("error", rej);
    s.listen(0, "127.0.0.1", () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => res(port));
    });
  });
}

export const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/** waitFor polls f until it returns a value other than undefined, or fails after ms. */
export async function waitFor<T>(what: string, f: () => Promise<T | undefined> | T | undefined, ms = 15_000): Promise<T> {
  const end = Date.now() + ms;
  for (;;) {
    const v = await f();
    if (v !== undefined) return v;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await sleep(50);
  }
}

export interface Env {
  url: string;
  nc: NatsConnection;
  dispatcherAddr?: string;
  /** connectExecutor connects as the executor user (limited by start's deny, else as nc); with reconnect, it outlives restartEmpty. */
  connectExecutor(o?: { reconnect?: boolean }): Promise<NatsConnection>;
  /**
   * restartEmpty stops nats-server, deletes its store and starts it again
   * on the same port (a development server restarted without its data); it
   * resolves to a new administrator's connection (nc is closed by then).
   */
  restartEmpty(): Promise<NatsConnection>;
  stop(): Promise<void>;
}

function kill(p: ChildProcess): Promise<void> {
  if (p.exitCode !== null) return Promise.resolve();
  return new Promise((r) => {
    p.once("exit", () => r());
    p.kill("SIGTERM");
    setTimeout(() => p.kill("SIGKILL"), 5_000).unref();
  });
}

/**
 * start runs nats-server (and, with dispatcher, the dispatcher) and
 * connects. With deny, the server has two users: an administrator (nc and
 * the dispatcher) and an executor user who may not publish to the subjects
 * in deny (connectExecutor).
 */
export async function start(opts: { dispatcher?: boolean; deny?: string[] } = {}): Promise<Env> {
  await buildBinaries();
  const dir = mkdtempSync(join(tmpdir(), "toolrelay-ts-"));
  const port = await freePort();
  const procs: ChildProcess[] = [];
  const args = ["-js", "-a", "127.0.0.1", "-p", String(port), "-sd", join(dir, "js")];
  const admin = opts.deny ? { user: "admin", pass: "admin-secret" } : {};
  const executor = opts.deny ? { user: "executor", pass: "executor-secret" } : {};
  if (opts.deny) {
    const conf = join(dir, "nats.conf");
    writeFileSync(conf, `authorization { users = [
  { user: admin, password: admin-secret }
  { user: executor, password: executor-secret, permissions: { publish: { allow: [">"], deny: ${JSON.stringify(opts.deny)} } } }
] }\n`);
    args.push("-c", conf);
  }
  const url = opts.deny ? `nats://admin:admin-secret@127.0.0.1:${port}` : `nats://127.0.0.1:${port}`;
  procs.push(spawn(join(binDir, "nats-server"), args, { stdio: "ignore" }));
  const servers = `nats://127.0.0.1:${port}`;
  const connectAdmin = () => waitFor("nats-server", async () => {
    try {
      return await connect({ servers, reconnect: false, ...admin });
    } catch {
      return undefined;
    }
  });
  const nc = await connectAdmin();
  const extra: NatsConnection[] = [];
  let dispatcherAddr: string | undefined;
  if (opts.dispatcher) {
    const addr = `127.0.0.1:${await freePort()}`;
    let logs = "";
    const d = spawn(join(binDir, "dispatcher"), ["serve"], {
      env: { ...process.env, NATS_URL: url, TOOLRELAY_HTTP_ADDR: addr, TOOLRELAY_DATA_DIR: join(dir, "d"), TOOLRELAY_LOG_LEVEL: "warn" },
      stdio: ["ignore", "ignore", "pipe"],
    });
    d.stderr!.on("data", (b) => (logs += b));
    procs.push(d);
    await waitFor("the dispatcher to be ready", async () => {
      if (d.exitCode !== null) throw new Error(`dispatcher exited ${d.exitCode}: ${logs}`);
      try {
        return (await fetch(`http://${addr}/readyz`)).ok ? true : undefined;
      } catch {
        return undefined;
      }
    }, 30_000);
    dispatcherAddr = addr;
  }
  return {
    url, nc, dispatcherAddr,
    async connectExecutor(o = {}) {
      const c = await connect({
        servers, ...executor,
        ...(o.reconnect ? { maxReconnectAttempts: -1, reconnectTimeWait: 100 } : { reconnect: false }),
      });
      extra.push(c);
      return c;
    },
    async restartEmpty() {
      await kill(procs[0]!);
      rmSync(join(dir, "js"), { recursive: true, force: true });
      procs[0] = spawn(join(binDir, "nats-server"), args, { stdio: "ignore" });
      const c = await connectAdmin();
      extra.push(c);
      return c;
    },
    async stop() {
      for (const c of extra) await c.close();
      await nc.close();
      for (const p of procs.reverse()) await kill(p);
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

export interface CallOutcome {
  output?: string;
  error?: { type: string; message: string };
  trace_id: string;
}

/** call runs fn through the dispatcher's /mcp with `dispatcher call -json`. */
export async function dispatcherCall(addr: string, fn: string, args: object): Promise<CallOutcome> {
  const r = await run(join(binDir, "dispatcher"), ["call", "-addr", `http://${addr}`, "-json", "-timeout", "60s", fn, JSON.stringify(args)], {
    cwd: repoRoot,
  }).catch((e: { stdout: string; stderr: string }) => e);
  try {
    return JSON.parse(r.stdout) as CallOutcome;
  } catch {
    throw new Error(`dispatcher call ${fn}: ${r.stdout} ${r.stderr}`);
  }
}

export const newCallKey = () => `${randomBytes(16).toString("hex")}.${randomBytes(8).toString("hex")}`;

/** publishCall publishes a call as the dispatcher would, for tests that drive the executor directly. */
export async function publishCall(nc: NatsConnection, team: string, fn: string, args: unknown,
  o: { key?: string; deadlineMs?: number; header?: Record<string, string>; keepResultUntil?: string } = {}): Promise<string> {
  const key = o.key ?? newCallKey();
  const deadline = new Date(Date.now() + (o.deadlineMs ?? 30_000)).toISOString();
  const call = { v: 1, key, platform: "mcp", scope: "mcp/test", call_id: `call_${key.slice(-6)}`, team, function: fn,
    arguments: args, deadline, created_at: new Date().toISOString(),
    ...(o.keepResultUntil ? { keep_result_until: o.keepResultUntil } : {}) };
  const h = headers();
  h.set("Toolrelay-Call-Key", key);
  h.set("Toolrelay-Deadline", deadline);
  h.set("Toolrelay-Function", fn);
  for (const [k, v] of Object.entries(o.header ?? {})) h.set(k, v);
  await jetstream(nc).publish(`fncall.${team}.${fn}`, JSON.stringify(call), { msgID: key, headers: h });
  return key;
}

/** result waits for the recorded result of key. */
export async function result(nc: NatsConnection, team: string, key: string, ms = 15_000): Promise<any> {
  const jsm = await jetstreamManager(nc);
  return waitFor(`the result of ${key}`, async () => {
    const m = await jsm.streams.getMessage(`FNRESULTS_${team}`, { last_by_subj: `fnresult.${team}.${key}` }).catch(() => null);
    return m ? m.json() : undefined;
  }, ms);
}

/** resultTTL waits for the result of key and returns its Nats-TTL header ("" for none). */
export async function resultTTL(nc: NatsConnection, team: string, key: string, ms = 15_000): Promise<string> {
  const jsm = await jetstreamManager(nc);
  return waitFor(`the result of ${key}`, async () => {
    const m = await jsm.streams.getMessage(`FNRESULTS_${team}`, { last_by_subj: `fnresult.${team}.${key}` }).catch(() => null);
    return m ? (m.header?.get("Nats-TTL") ?? "") : undefined;
  }, ms);
}

/** deadLetter returns the dead letter of key, if any. */
export async function deadLetter(nc: NatsConnection, team: string, fn: string, key: string): Promise<any> {
  const jsm = await jetstreamManager(nc);
  const m = await jsm.streams.getMessage("FNDLQ", { last_by_subj: `fndlq.${team}.${fn}.${key}` }).catch(() => null);
  return m ? m.json() : undefined;
}
