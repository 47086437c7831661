import test from "node:test";
import assert from "node:assert/strict";

import { exportURL } from "../src/api.js";

test("exportURL is relative and round-trips run, tag and format through the query", () => {
  const run = "exp 1/lr=0.1&x#y";
  const tag = "introspect/gradient/conv1/kernel:0";
  const url = exportURL(run, tag, "csv");
  assert.ok(url.startsWith("export?"), url);
  const q = new URLSearchParams(url.slice("export?".length));
  assert.deepEqual([...q.keys()], ["run", "tag", "format"]);
  assert.equal(q.get("run"), run);
  assert.equal(q.get("tag"), tag);
  assert.equal(q.get("format"), "csv");
});
