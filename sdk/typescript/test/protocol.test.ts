// The executor driven directly on the wire, with a stand-in dispatcher
// answering declare requests: what a turn through the dispatcher cannot
// easily show (side-effect marks, redeliveries, cancellations, stop).

import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { jetstream } from "@nats-io/jetstream";
import { deadLetter, newCallKey, publishCall, result, resultTTL, sleep, start, waitFor, type Env } from "./harness.js";
import { CallCancelledError, DeclarationRefusedError, DidNotRunError, Executor, ShutdownError } from "../src/index.js";
import * as p from "../src/protocol.js";

let env: Env;
const declares: Array<{ op: string; names: string[]; raw: string }> = [];
let refuseOwner: string | undefined;

before(async () => {
  env = await start();
  // A stand-in dispatcher: records requests, accepts all (or refuses, owned by another team).
  const sub = env.nc.subscribe("toolrelay.declare.*");
  (async () => {
    for await (const m of sub) {
      const req = JSON.parse(m.string());
      const names = req.declarations.map((d: any) => d.spec.name);
      declares.push({ op: req.op, names, raw: m.string() });
      m.respond(JSON.stringify(refuseOwner && req.op === "declare"
        ? { v: 1, refused: names.map((f: string) => ({ function: f, owner: refuseOwner, reason: `owned by team ${refuseOwner}` })) }
        : { v: 1, accepted: names }));
    }
  })();
});

after(async () => env?.stop());

test("declares with the schema byte for byte, and withdraws on shutdown", async () => {
  const ex = new Executor(env.nc, "tsdecl", { name: "t1" });
  const schema = `{"type":"object", "properties":{"n":{"type":"number","maximum":1.50}}}`;
  ex.register({ name: "f_decl", parameters: schema, handler: () => "ok", version: "1.2.3", timeoutMs: 1500 });
  await ex.start();
  const d = declares.find((x) => x.op === "declare" && x.names.includes("f_decl"))!;
  assert.ok(d.raw.includes(`"parameters":${schema}`), d.raw);
  const decl = JSON.parse(d.raw).declarations[0];
  assert.equal(decl.instance, ex.instance);
  assert.equal(decl.spec.team, "tsdecl");
  assert.equal(decl.spec.timeout, "1500ms");
  assert.equal(decl.spec.function_version, "1.2.3");
  await ex.shutdown();
  assert.ok(declares.some((x) => x.op === "withdraw" && x.names.includes("f_decl")));
});

test("a name another team owns is refused: start rejects and nothing is served", async () => {
  refuseOwner = "other";
  try {
    const ex = new Executor(env.nc, "tsrefused");
    ex.register({ name: "taken", handler: () => "ok" });
    await assert.rejects(ex.start(), (e: unknown) => e instanceof DeclarationRefusedError && e.ownedByOtherTeam);
    await ex.shutdown();
  } finally {
    refuseOwner = undefined;
  }
});

test("side effects: a compare-and-set mark, reconcile for a mark left running, may_have_run without reconcile", async () => {
  const team = "tsside";
  let runs = 0;
  const ex = new Executor(env.nc, team, { name: "t2" });
  ex.register({ name: "charge", sideEffects: true, handler: () => `charged ${++runs}`,
    reconcile: (_a, inv) => {
      if (inv.call.call_id.endsWith("0")) throw new DidNotRunError();
      return "found the earlier charge";
    } });
  ex.register({ name: "charge_blind", sideEffects: true, handler: () => "charged" });
  await ex.start();
  const js = jetstream(env.nc);

  // A first run marks the attempt running, by compare-and-set, and runs.
  const k1 = await publishCall(env.nc, team, "charge", {});
  assert.equal((await result(env.nc, team, k1)).output, "charged 1");
  const kv = await (await js.jetstreamManager()).streams.getMessage("KV_toolrelay_attempts", { last_by_subj: `$KV.toolrelay_attempts.${k1}` });
  assert.deepEqual({ ...kv!.json<any>(), at: undefined }, { state: "running", attempt: 1, executor: "t2", at: undefined });

  // A mark left running by a process that died: reconcile answers.
  const mark = JSON.stringify({ state: "running", attempt: 1, executor: "dead", at: new Date().toISOString() });
  let k2 = newCallKey();
  while (k2.endsWith("0")) k2 = newCallKey();
  await js.publish(`$KV.toolrelay_attempts.${k2}`, mark);
  await publishCall(env.nc, team, "charge", {}, { key: k2 });
  assert.equal((await result(env.nc, team, k2)).output, "found the earlier charge");

  // Without a reconcile hook: unavailable, and a may_have_run dead letter.
  const k3 = newCallKey();
  await js.publish(`$KV.toolrelay_attempts.${k3}`, mark);
  await publishCall(env.nc, team, "charge_blind", {}, { key: k3 });
  const r3 = await result(env.nc, team, k3);
  assert.equal(r3.error.type, "unavailable");
  assert.equal((await deadLetter(env.nc, team, "charge_blind", k3))?.reason, "may_have_run");

  // A mark of a retryable failure lets the next attempt run.
  const k4 = newCallKey();
  await js.publish(`$KV.toolrelay_attempts.${k4}`, JSON.stringify({ state: "failed_retryable", attempt: 1, executor: "x", at: new Date().toISOString() }));
  await publishCall(env.nc, team, "charge", {}, { key: k4 });
  assert.match((await result(env.nc, team, k4)).output, /^charged \d$/);
  await ex.shutdown();
});

test("a call whose result is recorded already is acknowledged without running", async () => {
  const team = "tsdone";
  let runs = 0;
  const ex = new Executor(env.nc, team, { name: "t3" });
  ex.register({ name: "once", handler: () => `ran ${++runs}` });
  await ex.start();
  await ex.shutdown(); // the streams exist; now leave a call waiting with its result recorded
  const key = newCallKey();
  const js = jetstream(env.nc);
  await js.publish(`fnresult.${team}.${key}`, JSON.stringify({ v: 1, key, call_id: "c", team, function: "once", output: "earlier", finished_at: new Date().toISOString() }),
    { msgID: key, expect: { lastSubjectSequence: 0 } });
  await publishCall(env.nc, team, "once", {}, { key });
  await sleep(1_100); // it waited over a second: the executor looks its result up
  const ex2 = new Executor(env.nc, team, { name: "t3b" });
  ex2.register({ name: "once", handler: () => `ran ${++runs}` });
  await ex2.start();
  const jsm = await js.jetstreamManager();
  await waitFor("the call to be acknowledged", async () => ((await jsm.streams.info(`FNCALLS_${team}`)).state.messages === 0 ? true : undefined));
  assert.equal(runs, 0);
  assert.equal((await result(env.nc, team, key)).output, "earlier");
  await ex2.shutdown();
});

test("resultTTL: until keep_result_until, at least a minute, at most two hours, in whole seconds", () => {
  const now = Date.parse("2026-01-01T00:00:00Z");
  const key = newCallKey();
  const call = (keep?: string) => ({ v: 1, key, platform: "mcp", scope: "s", call_id: "c", team: "t", function: "f",
    arguments: {}, deadline: "2026-01-01T00:09:30Z", created_at: "2026-01-01T00:00:00Z", ...(keep ? { keep_result_until: keep } : {}) });
  assert.equal(p.resultTTL(call(), now), undefined);
  assert.equal(p.resultTTL(call("2026-01-01T00:20:00.300Z"), now), "1201s");
  assert.equal(p.resultTTL(call("2025-12-31T00:00:00Z"), now), "60s");
  assert.equal(p.resultTTL(call("2027-01-01T00:00:00Z"), now), "7200s");
  assert.throws(() => p.decodeCall(new TextEncoder().encode(JSON.stringify(call("soon")))), /keep_result_until/);
});

test("results carry the Nats-TTL their call asks for; a call asking none gets none; an older result stream is updated", async () => {
  const team = "tsttl";
  const jsm = await jetstream(env.nc).jetstreamManager();
  // A result stream as an older version created it: no per-message TTLs.
  await jsm.streams.add({ name: `FNRESULTS_${team}`, subjects: [`fnresult.${team}.>`], retention: "limits" as any, discard: "new" as any,
    max_msgs_per_subject: 1, discard_new_per_subject: true, max_age: 2 * 3600 * 1e9, allow_direct: true });
  const ex = new Executor(env.nc, team, { name: "ttl" });
  ex.register({ name: "echo", handler: () => "ok" });
  await ex.start();
  assert.equal((await jsm.streams.info(`FNRESULTS_${team}`)).config.allow_msg_ttl, true);
  const keep = new Date(Date.now() + 20 * 60_000);
  const kept = await publishCall(env.nc, team, "echo", {}, { keepResultUntil: keep.toISOString() });
  const ttl = await resultTTL(env.nc, team, kept);
  const secs = Number(ttl.replace(/s$/, ""));
  assert.ok(ttl.endsWith("s") && secs > 19 * 60 && secs <= 20 * 60 + 1, `Nats-TTL ${ttl}, want about 1200s`);
  const plain = await publishCall(env.nc, team, "echo", {});
  assert.equal(await resultTTL(env.nc, team, plain), "");
  await ex.shutdown();
});

test("a cancelled turn aborts its running call with CallCancelledError and fails it as unavailable", async () => {
  const team = "tscancel";
  let reason: unknown;
  const ex = new Executor(env.nc, team, { name: "t4" });
  ex.register({ name: "wait", handler: (_a, inv) => new Promise((_, rej) => inv.signal.addEventListener("abort", () => rej((reason = inv.signal.reason)))) });
  let running = false;
  ex.register({ name: "mark", handler: () => { running = true; return "x"; } });
  await ex.start();
  const key = await publishCall(env.nc, team, "wait", {});
  await sleep(300);
  await jetstream(env.nc).publish(`fncancel.${team}.${key.split(".")[0]}`, "the MCP client cancelled the call", { msgID: `cancel.${key.split(".")[0]}.${team}` });
  const r = await result(env.nc, team, key);
  assert.equal(r.error.type, "unavailable");
  assert.match(r.error.message, /cancelled: the MCP client cancelled the call/);
  assert.ok(reason instanceof CallCancelledError);
  void running;
  await ex.shutdown();
});

test("graceful stop: a call still running at the shutdown timeout is aborted and handed back to another process", async () => {
  const team = "tsstop";
  let reason: unknown;
  const a = new Executor(env.nc, team, { name: "a", shutdownTimeoutMs: 300 });
  a.register({ name: "long", handler: (_x, inv) => new Promise((_, rej) => inv.signal.addEventListener("abort", () => rej((reason = inv.signal.reason)))) });
  await a.start();
  const key = await publishCall(env.nc, team, "long", {});
  await sleep(300);
  await a.shutdown();
  assert.ok(reason instanceof ShutdownError);
  const b = new Executor(env.nc, team, { name: "b" });
  b.register({ name: "long", handler: (_x, inv) => `done on attempt ${inv.attempt}` });
  await b.start();
  try {
    const r = await result(env.nc, team, key);
    assert.equal(r.output, "done on attempt 2", JSON.stringify(r));
  } finally {
    await b.shutdown();
  }
});

test("a malformed call is terminated, not run", async () => {
  const team = "tsbad";
  let runs = 0;
  const ex = new Executor(env.nc, team, { name: "t5" });
  ex.register({ name: "f", handler: () => `ran ${++runs}` });
  await ex.start();
  await jetstream(env.nc).publish(`fncall.${team}.f`, "{not json");
  const jsm = await jetstream(env.nc).jetstreamManager();
  await waitFor("the call to be terminated", async () => ((await jsm.streams.info(`FNCALLS_${team}`)).state.messages === 0 ? true : undefined));
  assert.equal(runs, 0);
  await ex.shutdown();
});
