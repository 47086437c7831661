import test from "node:test";
import assert from "node:assert/strict";

import { QUANTILE_FIELD, TAG_PREFIX, VIEWS } from "../src/schema.js";
import { formatG, ilrField, quantileField, tensorNameOfTag, viewOfTag } from "../src/slots.js";

test("quantileField spells every example of the schema as Python's slots.quantile_field", () => {
  assert.ok(QUANTILE_FIELD.examples.length >= 10);
  for (const [q, plain, log] of QUANTILE_FIELD.examples) {
    assert.equal(quantileField(q, false), plain, `q=${q}`);
    assert.equal(quantileField(q, true), log, `q=${q}`);
  }
  assert.equal(ilrField(2.5), "ilr_q2.5");
});

test("formatG: Python's f\"{x:g}\" (values printed by Python)", () => {
  const python = [
    [1e6, "1e+06"], [123456789, "1.23457e+08"], [999999.5, "1e+06"], [99999.95, "99999.9"], [99999.96, "100000"],
    [-0.5, "-0.5"], [-0, "-0"], [0.00001234565, "1.23456e-05"], [0.0001, "0.0001"],
    [0.000099999, "9.9999e-05"], [1.5, "1.5"], [2.5e-7, "2.5e-07"], [1e100, "1e+100"],
    [NaN, "nan"], [Infinity, "inf"], [-Infinity, "-inf"],
  ];
  for (const [x, text] of python) assert.equal(formatG(x), text, String(x));
  assert.equal(formatG(Math.PI, 3), "3.14");
});

test("formatG rounds a tie to even as Python does, where toPrecision rounds it up", () => {
  // 2**-10 = 0.0009765625 exactly: its 6th significant digit is followed by exactly 5.
  assert.equal(formatG(2 ** -10), "0.000976562");
  assert.equal(Number((2 ** -10).toPrecision(6)).toString(), "0.000976563");
  assert.equal(formatG(0.375, 2), "0.38"); // 0.375 exact: 7 is odd, rounds up
  assert.equal(formatG(0.625, 2), "0.62"); // 0.625 exact: 2 is even, stays
});

test("viewOfTag: the view of a statistics tag, null for other tags", () => {
  for (const v of VIEWS) assert.equal(viewOfTag(`${TAG_PREFIX}${v}/dense/kernel`), v);
  assert.equal(viewOfTag(`${TAG_PREFIX}metric/loss`), null);
  assert.equal(viewOfTag(`${TAG_PREFIX}activity/conv`), null);
  assert.equal(viewOfTag("gradient/dense/kernel"), null);
  assert.equal(viewOfTag(""), null);
  assert.equal(viewOfTag(undefined), null);
});

test("tensorNameOfTag drops the prefix and the kind, keeps any other tag", () => {
  assert.equal(tensorNameOfTag(`${TAG_PREFIX}gradient/dense/kernel`), "dense/kernel");
  assert.equal(tensorNameOfTag(`${TAG_PREFIX}metric/loss`), "loss");
  assert.equal(tensorNameOfTag("dense/kernel"), "dense/kernel");
  assert.equal(tensorNameOfTag(`${TAG_PREFIX}Dense`), `${TAG_PREFIX}Dense`);
});
