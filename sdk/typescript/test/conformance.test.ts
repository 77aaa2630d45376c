// The protocol conformance kit (docs/operations.md, "Conformance kit") run
// against this library: `dispatcher conformance -exec` starts
// examples/conformance.ts as a process (an embedded NATS server and a
// dispatcher in the kit), stops and restarts it, and must pass every case.

import { execFile } from "node:child_process";
import { join } from "node:path";
import { test } from "node:test";
import assert from "node:assert/strict";
import { binDir, buildBinaries, repoRoot } from "./harness.js";

const quote = (s: string) => `'${s.replaceAll("'", `'\\''`)}'`;

test("the conformance kit passes every case against examples/conformance.ts", { timeout: 300_000 }, async (t) => {
  await buildBinaries();
  const script = join(repoRoot, "sdk/typescript/dist/examples/conformance.js");
  const env = { ...process.env };
  delete env.NATS_URL; // the kit's own embedded server and dispatcher, whatever the environment says
  const { code, stdout, stderr } = await new Promise<{ code: number | null; stdout: string; stderr: string }>((resolve) => {
    const p = execFile(join(binDir, "dispatcher"), ["conformance", "-team", "tsconformance", "-exec", `${quote(process.execPath)} ${quote(script)}`],
      { cwd: repoRoot, env, maxBuffer: 64 << 20 }, (_err, stdout, stderr) => resolve({ code: p.exitCode, stdout, stderr }));
  });
  for (const line of stdout.split("\n").filter(Boolean)) t.diagnostic(line);
  const lines = stdout.split("\n").filter(Boolean);
  const bad = lines.filter((l) => /^(FAIL|SKIP) /.test(l));
  const summary = lines.at(-1) ?? "";
  assert.ok(code === 0 && bad.length === 0 && /^\d+ passed, 0 failed, 0 skipped /.test(summary) && lines.some((l) => l.startsWith("PASS ")),
    `the kit exited ${code}:\n${stdout}\nthe kit's and the executor's log (last 4 KB):\n${stderr.slice(-4096)}`);
});
