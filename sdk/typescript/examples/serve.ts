// serve.ts: serve functions from a small script, for trying the library and
// for driving it with a conformance kit.
//
//   NATS_URL=nats://127.0.0.1:4222 TOOLRELAY_TEAM=demo node dist/examples/serve.js
//
// It serves echo (its arguments back as JSON), fail (a permanent error),
// refuse (a refusal), flaky (retryable on the first attempt), sleep (waits
// for its deadline, or arguments.ms) and charge (a side-effect function
// with a reconcile hook); FUNCTIONS=echo,sleep picks some. Each name is
// served with the prefix PREFIX (default: none), e.g. PREFIX=conformance_
// serves conformance_echo. SIGTERM or SIGINT stops it gracefully.

import { connect } from "@nats-io/transport-node";
import { DidNotRunError, Executor, RefusalError, RetryableError, type FunctionDef } from "../src/index.js";

const nc = await connect({ servers: process.env.NATS_URL ?? "nats://127.0.0.1:4222" });
const ex = new Executor(nc, process.env.TOOLRELAY_TEAM ?? "demo", {
  name: process.env.TOOLRELAY_EXECUTOR_NAME,
  logger: { info: (m, a) => console.error(JSON.stringify({ level: "info", msg: m, ...a })), warn: console.error, error: console.error },
});
const prefix = process.env.PREFIX ?? "";
const effects = new Set<string>();

const all: FunctionDef[] = [
  { name: "echo", description: "Returns its arguments.", parameters: { type: "object" }, handler: (args) => args },
  { name: "fail", description: "Always fails.", handler: () => { throw new Error("fail failed, as it always does"); } },
  { name: "refuse", description: "Always refuses.", handler: () => { throw new RefusalError("refuse declines every request"); } },
  { name: "flaky", description: "Fails retryably on the first attempt.", handler: (_a, inv) => {
    if (inv.attempt === 1) throw new RetryableError("flaky: try again");
    return `ok on attempt ${inv.attempt}`;
  } },
  { name: "sleep", description: "Waits ms milliseconds, or until its deadline.",
    parameters: { type: "object", properties: { ms: { type: "integer", minimum: 0 } } },
    handler: ({ ms }: { ms?: number }, inv) => new Promise((resolve, reject) => {
      const t = ms === undefined ? undefined : setTimeout(() => resolve(`slept ${ms}ms`), ms);
      inv.signal.addEventListener("abort", () => { clearTimeout(t); reject(inv.signal.reason); });
    }) },
  { name: "charge", description: "A side effect, done once per call.", sideEffects: true,
    handler: (_a, inv) => { effects.add(inv.call.key); return `charged ${inv.call.key}`; },
    reconcile: (_a, inv) => {
      if (!effects.has(inv.call.key)) throw new DidNotRunError();
      return `charged ${inv.call.key} (found)`;
    } },
];
const only = process.env.FUNCTIONS?.split(",").filter(Boolean);
for (const f of all) if (!only || only.includes(f.name)) ex.register({ ...f, name: prefix + f.name });

await ex.start();
console.error(JSON.stringify({ level: "info", msg: "serving", team: ex.team, instance: ex.instance }));
for (const sig of ["SIGTERM", "SIGINT"] as const) {
  process.once(sig, async () => {
    await ex.shutdown();
    await nc.close();
  });
}
