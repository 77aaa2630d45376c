// Full turns through the real dispatcher: `dispatcher call` sends each
// function call through its /mcp front door, as a platform's call runs.

import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { dispatcherCall, deadLetter, start, waitFor, type Env } from "./harness.js";
import { DeadlineError, Executor, RefusalError, RetryableError, type Invocation } from "../src/index.js";

const team = "tsturn";
let env: Env;
let ex: Executor;
const attempts = new Map<string, number>();
const seen = new Map<string, { schema?: string; traceparent?: string; reason?: unknown }>();
const resultHeaders: Array<{ key: string; traceparent?: string }> = [];

// A schema with what the digest must get right: non-ASCII, <>& and a number
// that is not a float64.
const weatherSchema = `{"type":"object","description":"Wetter <heute> & morgen, 日本","properties":{"location":{"type":"string","maxLength":9007199254740993}},"required":["location"]}`;

before(async () => {
  env = await start({ dispatcher: true });
  ex = new Executor(env.nc, team, { name: "ts-test", ackWaitMs: 3_000 });
  ex.register<{ location: string }>({
    name: "ts_weather", description: "The weather at a location.", parameters: weatherSchema,
    handler: async ({ location }, inv: Invocation) => {
      seen.set("ts_weather", { schema: undefined });
      return `sunny in ${location} (attempt ${inv.attempt})`;
    },
  });
  ex.register({
    name: "ts_flaky", parameters: { type: "object", properties: {} }, retry: { initialBackoffMs: 50 },
    handler: (_args, inv) => {
      attempts.set("ts_flaky", inv.attempt);
      if (inv.attempt === 1) throw new RetryableError("backend busy");
      return { ok: true, attempt: inv.attempt };
    },
  });
  ex.register({
    name: "ts_meta", title: "Weather now", icons: [{ src: "https://icons.example.com/w.svg", mimeType: "image/svg+xml", sizes: ["any"], theme: "dark" }],
    outputSchema: { type: "object", properties: { temperature: { type: "number" } }, required: ["temperature"] },
    handler: () => ({ temperature: 21.5 }),
  });
  ex.register({
    name: "ts_refund", sideEffects: true, approval: { when: "args.amount > 100", approvers: ["team", "admin"] },
    parameters: { type: "object", properties: { amount: { type: "number" } }, required: ["amount"] },
    handler: ({ amount }: { amount: number }) => `refunded ${amount}`,
  });
  ex.register({ name: "ts_refuse", handler: () => { throw new RefusalError("The order has shipped; it cannot be changed."); } });
  ex.register({ name: "ts_broken", handler: () => { throw new Error("the ledger is corrupt"); } });
  ex.register({
    name: "ts_slow", timeoutMs: 300,
    handler: (_a, inv) => new Promise((_, reject) => inv.signal.addEventListener("abort", () => {
      seen.set("ts_slow", { reason: inv.signal.reason });
      reject(inv.signal.reason);
    })),
  });
  const sub = env.nc.subscribe(`fnresult.${team}.>`);
  (async () => {
    for await (const m of sub) resultHeaders.push({ key: m.headers?.get("Toolrelay-Call-Key") ?? "", traceparent: m.headers?.get("traceparent") });
  })();
  await ex.start();
});

after(async () => {
  await ex?.shutdown();
  await env?.stop();
});

test("success: the output reaches the caller, the schema digest is the dispatcher's, the trace is kept", async () => {
  const r = await dispatcherCall(env.dispatcherAddr!, "ts_weather", { location: "Paris" });
  assert.equal(r.error, undefined, JSON.stringify(r));
  assert.equal(r.output, "sunny in Paris (attempt 1)");
  // The dispatcher's own view of the function's schema digest is ours.
  const fns = (await (await fetch(`http://${env.dispatcherAddr}/v1/functions`)).json()) as any;
  const list: any[] = Array.isArray(fns) ? fns : fns.functions ?? [];
  const mine = list.find((f) => f.name === "ts_weather" || f.function === "ts_weather");
  assert.ok(mine, `ts_weather in /v1/functions: ${JSON.stringify(fns).slice(0, 300)}`);
  assert.equal(mine.schema_digest, ex.digest("ts_weather"));
  // The result carries the call's trace: the trace ID `dispatcher call` started.
  const tp = await waitFor("the result's traceparent", () => resultHeaders.find((h) => h.traceparent?.includes(r.trace_id))?.traceparent);
  assert.match(tp, new RegExp(`^00-${r.trace_id}-[0-9a-f]{16}-0[01]$`));
});

test("a retryable failure is naked and the next attempt succeeds", async () => {
  const r = await dispatcherCall(env.dispatcherAddr!, "ts_flaky", {});
  assert.equal(r.output, `{"ok":true,"attempt":2}`);
  assert.equal(attempts.get("ts_flaky"), 2);
});

test("a refusal is a function_error the model reads, without a dead letter", async () => {
  const r = await dispatcherCall(env.dispatcherAddr!, "ts_refuse", {});
  assert.deepEqual(r.error, { type: "function_error", message: "The order has shipped; it cannot be changed." });
  const key = resultHeaders.at(-1)!.key;
  assert.equal(await deadLetter(env.nc, team, "ts_refuse", key), undefined);
});

test("a permanent failure leaves a dead letter, then its result", async () => {
  const r = await dispatcherCall(env.dispatcherAddr!, "ts_broken", {});
  assert.deepEqual(r.error, { type: "function_error", message: "the ledger is corrupt" });
  const key = resultHeaders.at(-1)!.key;
  const dl = await deadLetter(env.nc, team, "ts_broken", key);
  assert.equal(dl?.reason, "permanent_error");
  assert.equal(dl?.call.key, key);
  assert.equal(dl?.result.error.type, "function_error");
});

test("the deadline is an AbortSignal: the function's timeout aborts it and the call times out", async () => {
  const r = await dispatcherCall(env.dispatcherAddr!, "ts_slow", {});
  assert.equal(r.error?.type, "timeout", JSON.stringify(r));
  assert.ok(seen.get("ts_slow")?.reason instanceof DeadlineError);
});

test("title, icons and output schema reach MCP clients; a matching output is structured content", async () => {
  const mcp = async (body: object) => {
    const r = await fetch(`http://${env.dispatcherAddr}/mcp`, {
      method: "POST", headers: { "Content-Type": "application/json", Accept: "application/json, text/event-stream" }, body: JSON.stringify(body),
    });
    const text = await r.text();
    // An answer as an event stream carries the JSON-RPC message in its data line.
    const data = text.startsWith("{") ? text : text.split("\n").find((l) => l.startsWith("data: "))!.slice(6);
    return JSON.parse(data);
  };
  const list = await mcp({ jsonrpc: "2.0", id: 1, method: "tools/list" });
  const tool = list.result.tools.find((t: any) => t.name === "ts_meta");
  assert.ok(tool, JSON.stringify(list).slice(0, 300));
  assert.equal(tool.title, "Weather now");
  assert.deepEqual(tool.icons, [{ src: "https://icons.example.com/w.svg", mimeType: "image/svg+xml", sizes: ["any"], theme: "dark" }]);
  assert.equal(tool.outputSchema.properties.temperature.type, "number");
  const call = await mcp({ jsonrpc: "2.0", id: 2, method: "tools/call", params: { name: "ts_meta", arguments: {} } });
  assert.deepEqual(call.result.structuredContent, { temperature: 21.5 }, JSON.stringify(call));
});

test("approval: a refund over the condition waits, and the model reads who denied it and why", async () => {
  const small = await dispatcherCall(env.dispatcherAddr!, "ts_refund", { amount: 5 });
  assert.equal(small.output, "refunded 5", JSON.stringify(small));
  const big = dispatcherCall(env.dispatcherAddr!, "ts_refund", { amount: 500 });
  const held = await waitFor("the refund to await approval", async () => {
    const list = (await (await fetch(`http://${env.dispatcherAddr}/v1/approvals?team=${team}`)).json()) as any;
    return list.approvals.find((a: any) => a.function === "ts_refund");
  });
  assert.equal(held.condition, "args.amount > 100");
  assert.deepEqual(held.approvers, ["team", "admin"]);
  const r = await fetch(`http://${env.dispatcherAddr}/v1/approvals/${held.call_key}/deny`, {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ reason: "refunds over 100 go through finance" }),
  });
  assert.equal(r.status, 200, await r.text());
  const out = await big;
  assert.equal(out.error?.type, "denied", JSON.stringify(out));
  assert.match(out.error!.message, /refunds over 100 go through finance/);
});

test("approval: a policy with both required and a condition is refused at register, naming the function", () => {
  const fresh = new Executor(env.nc, team, { name: "ts-policy" });
  assert.throws(() => fresh.register({ name: "ts_bad_policy", approval: { required: true, when: "args.x > 1" }, handler: () => "x" }),
    /ts_bad_policy: approval/);
});
