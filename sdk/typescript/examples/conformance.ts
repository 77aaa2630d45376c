// conformance.ts: the conformance kit's test functions on this library, for
// `dispatcher conformance -exec` (docs/operations.md, "Conformance kit").
// Names, schemas and behaviours are the kit's, as its Go reference
// kit.GoFunctions (internal/conformance/kit/functions.go) has them:
//
//   dispatcher conformance -team T -exec "node dist/examples/conformance.js"
//
// The kit sets NATS_URL and TOOLRELAY_TEAM, and stops the process with
// SIGTERM: it withdraws its declarations, lets running calls finish (or
// hands them back) and exits 0.

import { connect } from "@nats-io/transport-node";
import { Executor, InvalidArgumentsError, RefusalError, RetryableError } from "../src/index.js";

// kit.EchoSchema, byte for byte: its digest is what the kit checks.
const echoSchema = `{"type": "object", "description": "Text to echo: Größe <b> & \\"so\\"", ` +
  `"properties": {"text": {"type": "string", "maxLength": 8}}, "required": ["text"], ` +
  `"additionalProperties": false, "examples": [{"text": "°C"}], "$comment": "1.50 -0 1e-2", "x-numbers": [1.50, -0, 1e-2, 20]}`;

const log = (level: string) => (msg: string, attrs?: object) => console.error(JSON.stringify({ level, msg, ...attrs }));
const nc = await connect({ servers: process.env.NATS_URL ?? "nats://127.0.0.1:4222" });
const ex = new Executor(nc, process.env.TOOLRELAY_TEAM ?? "conformance", {
  name: process.env.TOOLRELAY_EXECUTOR_NAME ?? "ts-conformance",
  logger: { info: log("info"), warn: log("warn"), error: log("error") },
});

// The text of {"text": string}; as Go's json.Unmarshal, anything else is invalid arguments
// (a call the dispatcher checked under the same digest is not checked again here).
const text = ({ text }: { text?: unknown }) => {
  if (typeof text !== "string") throw new InvalidArgumentsError("text: want a string");
  return text;
};

ex.register({ name: "conformance_echo", description: "Echo the text.", parameters: echoSchema, handler: text });
ex.register<{ mode: string }>({
  name: "conformance_fail", description: "Fail as asked.",
  parameters: { type: "object", properties: { mode: { enum: ["error", "refuse"] } }, required: ["mode"] },
  handler: ({ mode }) => {
    if (mode === "refuse") throw new RefusalError("conformance_fail refused as asked");
    throw new Error("conformance_fail failed as asked");
  },
});
ex.register<{ fail_times: number }>({
  name: "conformance_retry", description: "Fail retryably a number of times, then succeed.",
  parameters: { type: "object", properties: { fail_times: { type: "integer", minimum: 0 } }, required: ["fail_times"] },
  retry: { initialBackoffMs: 50, maxBackoffMs: 200 },
  handler: ({ fail_times }, inv) => {
    if (inv.attempt <= fail_times) throw new RetryableError(`conformance_retry failed attempt ${inv.attempt} as asked`);
    return `attempt ${inv.attempt}`;
  },
});
ex.register<{ ms: number }>({
  name: "conformance_slow", description: "Wait a while.", timeoutMs: 2_000,
  parameters: { type: "object", properties: { ms: { type: "integer", minimum: 0 } }, required: ["ms"] },
  handler: ({ ms }, { signal }) => new Promise((resolve, reject) => {
    if (signal.aborted) return reject(signal.reason);
    const t = setTimeout(() => resolve(`slept ${ms}ms`), ms);
    signal.addEventListener("abort", () => { clearTimeout(t); reject(signal.reason); }, { once: true });
  }),
});
ex.register({
  name: "conformance_effect", description: "Echo the text, as a side effect.", sideEffects: true,
  parameters: { type: "object", properties: { text: { type: "string" } }, required: ["text"] },
  handler: text,
});

await ex.start();
for (const sig of ["SIGTERM", "SIGINT"] as const) {
  process.once(sig, async () => {
    await ex.shutdown();
    await nc.close();
  });
}
