// Healing (docs/protocol.md, "Declare only what you pull"; issue 38): an
// executor whose consumer or stream is deleted under it recreates them and
// serves again within seconds; one that may not recreate them withdraws the
// function's declaration, says why, and declares it again once an operator
// has put them back. Real nats-server and dispatcher; as pkg/exec's
// heal_test.go.

import { test, type TestContext } from "node:test";
import assert from "node:assert/strict";
import type { NatsConnection } from "@nats-io/transport-node";
import { jetstreamManager, type JetStreamManager } from "@nats-io/jetstream";
import { dispatcherCall, publishCall, result, start, waitFor, type Env } from "./harness.js";
import { Executor, protocol as p, type Logger } from "../src/index.js";
import * as prov from "../src/provision.js";

/**
 * How long an executor may take to serve again after its consumer or
 * stream is gone: missing heartbeats show within 5s, recreating takes a
 * second to settle and a few round trips (pkg/exec's healWithin).
 */
const HEAL_WITHIN_MS = 15_000;

interface Line { level: string; msg: string; attrs: Record<string, unknown> }

function recorder(): Logger & { lines: Line[]; logged(level: string, msg: string): Line | undefined } {
  const lines: Line[] = [];
  const rec = (level: string) => (msg: string, attrs: object = {}) => lines.push({ level, msg, attrs: attrs as Record<string, unknown> });
  return {
    lines, info: rec("info"), warn: rec("warn"), error: rec("error"),
    logged: (level, msg) => lines.find((l) => l.level === level && l.msg.includes(msg)),
  };
}

/** executorsOf lists the instances the dispatcher counts as serving fn (GET /v1/functions). */
async function executorsOf(env: Env, fn: string): Promise<string[]> {
  const body = (await (await fetch(`http://${env.dispatcherAddr}/v1/functions`)).json()) as
    { functions: { name: string; executors: { instance: string }[] }[] };
  return (body.functions.find((f) => f.name === fn)?.executors ?? []).map((e) => e.instance);
}

/** serve starts an executor of team serving fn (an echo) on nc, shut down after t. */
async function serve(t: TestContext, nc: NatsConnection, team: string, fn: string): Promise<{ ex: Executor; log: ReturnType<typeof recorder> }> {
  const log = recorder();
  const ex = new Executor(nc, team, { name: `heal-${fn}`, logger: log, shutdownTimeoutMs: 2_000 });
  ex.register<{ n: number }>({ name: fn, handler: ({ n }) => `echo ${n}` });
  await ex.start();
  t.after(() => ex.shutdown());
  return { ex, log };
}

/** served runs fn through the dispatcher and fails unless it succeeds. */
async function served(env: Env, fn: string, n: number): Promise<void> {
  const r = await dispatcherCall(env.dispatcherAddr!, fn, { n });
  assert.equal(r.output, `echo ${n}`, `${fn}: ${JSON.stringify(r)}`);
}

async function consumerExists(jsm: JetStreamManager, team: string, fn: string): Promise<true | undefined> {
  return (await jsm.consumers.info(p.callStream(team), fn).then(() => true, () => undefined));
}

test("executors that may recreate what they own", async (t) => {
  const env = await start({ dispatcher: true });
  t.after(() => env.stop());
  const jsm = await jetstreamManager(env.nc);

  await t.test("a deleted consumer is recreated and its calls are served again", async (t) => {
    const [team, fn] = ["tsheal-consumer", "heal_consumer"];
    const { ex, log } = await serve(t, env.nc, team, fn);
    await served(env, fn, 1);

    await jsm.consumers.delete(p.callStream(team), fn);
    const deleted = Date.now();
    await waitFor("the executor to recreate its consumer", () => consumerExists(jsm, team, fn), HEAL_WITHIN_MS);
    await served(env, fn, 2);
    const took = Date.now() - deleted;
    t.diagnostic(`served again ${took} ms after the consumer was deleted`);
    assert.ok(took < HEAL_WITHIN_MS, `served again after ${took} ms`);
    assert.ok(log.logged("warn", "the function's consumer is gone; recreating it"), JSON.stringify(log.lines));
    assert.ok(log.logged("info", "the function's consumer exists again; serving it"), JSON.stringify(log.lines));
    // Recreated within seconds, it was never withdrawn (as pkg/exec).
    assert.equal(log.logged("error", "cannot recreate"), undefined, JSON.stringify(log.lines));
    assert.deepEqual(await executorsOf(env, fn), [ex.instance]);
  });

  await t.test("a deleted call stream is created again by the executor, and calls are served again", async (t) => {
    const [team, fn] = ["tsheal-stream", "heal_stream"];
    const { ex, log } = await serve(t, env.nc, team, fn);
    await served(env, fn, 1);

    await jsm.streams.delete(p.callStream(team));
    const deleted = Date.now();
    await waitFor("the executor to recreate its stream and consumer", () => consumerExists(jsm, team, fn), HEAL_WITHIN_MS);
    await served(env, fn, 2);
    const took = Date.now() - deleted;
    t.diagnostic(`served again ${took} ms after the stream was deleted`);
    assert.ok(took < HEAL_WITHIN_MS, `served again after ${took} ms`);
    assert.ok(log.logged("warn", "the function's consumer is gone; recreating it"), JSON.stringify(log.lines));
  });

  await t.test("an operator deletes the call stream and creates it again: the consumer is recreated on the new stream", async (t) => {
    const [team, fn] = ["tsheal-restore", "heal_restore"];
    const { ex } = await serve(t, env.nc, team, fn);
    await served(env, fn, 1);

    await jsm.streams.delete(p.callStream(team));
    await prov.ensureStream(jsm, prov.callStreamConfig(team, 1));
    const recreated = Date.now();
    await waitFor("the executor to recreate its consumer", () => consumerExists(jsm, team, fn), HEAL_WITHIN_MS);
    await served(env, fn, 2);
    t.diagnostic(`served again ${Date.now() - recreated} ms after the stream was recreated`);
  });
});

// The server starts again on an empty store (a development server
// restarted without its data): no "consumer deleted" reaches the pull, which
// finds its consumer gone when it resumes after reconnecting. No dispatcher
// here: calls are published and results read as the dispatcher would.
test("a server started again on an empty store: the executor recreates its stream and consumer and serves again", async (t) => {
  const [team, fn] = ["tsheal-empty", "heal_empty"];
  const env = await start();
  t.after(() => env.stop());
  const { log } = await serve(t, await env.connectExecutor({ reconnect: true }), team, fn);
  const key = await publishCall(env.nc, team, fn, { n: 1 });
  assert.equal((await result(env.nc, team, key)).output, "echo 1");

  const nc = await env.restartEmpty();
  const restarted = Date.now();
  const jsm = await jetstreamManager(nc);
  await waitFor("the executor to recreate its stream and consumer", () => consumerExists(jsm, team, fn), HEAL_WITHIN_MS);
  const again = await publishCall(nc, team, fn, { n: 2 });
  assert.equal((await result(nc, team, again, HEAL_WITHIN_MS)).output, "echo 2");
  t.diagnostic(`served again ${Date.now() - restarted} ms after the server restarted`);
  assert.ok(log.logged("warn", "the function's consumer is gone; recreating it"), JSON.stringify(log.lines));
});

test("executors that may not recreate what they own", async (t) => {
  const [team, fn] = ["tsheal-denied", "heal_denied"];
  const stream = p.callStream(team);
  // The executor's user may not create or change its team's call stream
  // or its consumers: the control plane provisions them.
  const env = await start({
    dispatcher: true,
    deny: [`$JS.API.STREAM.CREATE.${stream}`, `$JS.API.STREAM.UPDATE.${stream}`, `$JS.API.CONSUMER.CREATE.${stream}`,
      `$JS.API.CONSUMER.CREATE.${stream}.>`, `$JS.API.CONSUMER.DURABLE.CREATE.${stream}.>`],
  });
  t.after(() => env.stop());
  const jsm = await jetstreamManager(env.nc);
  const provision = async () => {
    await prov.ensureStream(jsm, prov.callStreamConfig(team, 1));
    await prov.ensureConsumer(jsm, team, fn, 1000, p.DEFAULT_ACK_WAIT_MS);
  };
  await provision();
  await prov.ensureStream(jsm, prov.resultStreamConfig(team, 1));

  await t.test("the call stream deleted: the function is withdrawn, saying why, and served again once the stream is back", async (t) => {
    const { ex, log } = await serve(t, await env.connectExecutor(), team, fn);
    await served(env, fn, 1);
    await waitFor("the dispatcher to count the executor", async () => ((await executorsOf(env, fn)).includes(ex.instance) ? true : undefined));

    await jsm.streams.delete(stream);
    const deleted = Date.now();
    await waitFor("the declaration to be withdrawn", async () => ((await executorsOf(env, fn)).length === 0 ? true : undefined), HEAL_WITHIN_MS);
    t.diagnostic(`withdrawn ${Date.now() - deleted} ms after the stream was deleted`);
    const why = log.logged("error", "cannot recreate the function's consumer");
    assert.ok(why, `no error saying why ${fn} is not served: ${JSON.stringify(log.lines)}`);
    assert.match(String(why.attrs.err), /permission/i);
    assert.equal(why.attrs.fn, fn);
    // Not counted as served: a call fails as unavailable, not after its timeout.
    const r = await dispatcherCall(env.dispatcherAddr!, fn, { n: 2 });
    assert.equal(r.error?.type, "unavailable", JSON.stringify(r));

    // The control plane puts the stream and consumer back.
    await provision();
    const restored = Date.now();
    await waitFor("the function to be declared again", async () => ((await executorsOf(env, fn)).includes(ex.instance) ? true : undefined),
      HEAL_WITHIN_MS);
    await served(env, fn, 3);
    t.diagnostic(`declared and served again ${Date.now() - restored} ms after the stream was restored`);
    assert.ok(log.logged("info", "the function's consumer exists again; serving it"), JSON.stringify(log.lines));
  });
});
