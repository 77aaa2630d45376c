import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { repoRoot } from "./harness.js";
import { schemaDigest } from "../src/index.js";

// The vectors were computed by the Go dispatcher's own digest
// (internal/schema.Digest): key order, spacing, numbers as written, Go's
// escaping of <, >, &, U+2028, lone surrogates, repeated keys, trailing
// data after the first value, and text that is not JSON.
test("schema digest matches the dispatcher's on every vector", () => {
  const vectors = JSON.parse(readFileSync(join(repoRoot, "sdk/typescript/test/testdata/digests.json"), "utf8")) as Record<string, string>;
  assert.ok(Object.keys(vectors).length >= 6);
  for (const [schema, want] of Object.entries(vectors)) {
    assert.equal(schemaDigest(schema), want, `digest of ${JSON.stringify(schema)}`);
  }
});
