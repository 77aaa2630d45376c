// Declarations past one request's bounds: an executor of hundreds of
// functions, or of a few with large schemas, declares them in several
// requests, each within the protocol's bounds, every function in one.

import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import type { NatsConnection } from "@nats-io/transport-node";
import { start, type Env } from "./harness.js";
import { Lease } from "../src/declare.js";
import * as p from "../src/protocol.js";

const team = "tsmany";
let env: Env;

before(async () => {
  env = await start();
});

after(async () => {
  await env?.stop();
});

/** standIn answers every declare request as a dispatcher that stores all, and records each. */
function standIn(nc: NatsConnection): Array<{ op: string; names: string[]; bytes: number }> {
  const seen: Array<{ op: string; names: string[]; bytes: number }> = [];
  nc.subscribe(p.declareSubject(team), {
    callback: (_err, m) => {
      const req = JSON.parse(m.string());
      const names: string[] = req.declarations.map((d: any) => d.spec.name);
      seen.push({ op: req.op, names, bytes: m.data.length });
      m.respond(JSON.stringify({ v: p.VERSION, accepted: names }));
    },
  });
  return seen;
}

function declarations(n: number, parameters: string): Map<string, string> {
  const m = new Map<string, string>();
  const now = new Date().toISOString();
  for (let i = 0; i < n; i++) {
    const name = `fn_${String(i).padStart(4, "0")}`;
    m.set(name, `{"v":1,"spec":{"v":1,"name":"${name}","team":"${team}","parameters":${parameters},"updated_at":"${now}"},` +
      `"instance":"many","started_at":"${now}"}`);
  }
  return m;
}

for (const c of [
  { name: "600 small", n: 600, parameters: `{"type":"object"}`, want: 3 },
  { name: "40 of 60 KB", n: 40, parameters: `{"type":"object","description":"${"x".repeat(60 << 10)}"}`, want: 3 },
]) {
  test(`${c.name}: declared and withdrawn in ${c.want} requests within the bounds`, async () => {
    const seen = standIn(env.nc);
    await env.nc.flush();
    const lease = new Lease(env.nc, team, declarations(c.n, c.parameters), () => {});
    await lease.declare();
    await lease.withdraw();
    for (const op of ["declare", "withdraw"]) {
      const reqs = seen.filter((r) => r.op === op);
      assert.equal(reqs.length, c.want, `${op}: ${reqs.length} requests`);
      for (const r of reqs) {
        assert.ok(r.names.length <= p.MAX_DECLARATIONS, `${op}: ${r.names.length} declarations in one request`);
        assert.ok(r.bytes <= p.MAX_ENVELOPE_SIZE, `${op}: a request of ${r.bytes} bytes`);
      }
      const all = reqs.flatMap((r) => r.names);
      assert.equal(new Set(all).size, c.n, `${op}: ${new Set(all).size} distinct functions`);
      assert.equal(all.length, c.n, `${op}: ${all.length} declarations for ${c.n} functions`);
    }
  });
}
