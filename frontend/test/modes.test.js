import test from "node:test";
import assert from "node:assert/strict";

import {
  MODES, MODE_IDS, defaultMode, fieldsFor, ilrField, mode, modesFor, modesOfView, quantileField,
} from "../src/modes.js";

const QS = [5, 25, 50, 75, 95];

test("mode ids are unique and each looks up its own entry", () => {
  assert.equal(new Set(MODE_IDS).size, MODES.length);
  for (const id of MODE_IDS) assert.equal(mode(id).id, id);
  assert.equal(mode("nope"), undefined);
});

test("defaultMode: weights and outputs open as values, gradients as magnitudes", () => {
  assert.equal(defaultMode("variable"), "values");
  assert.equal(defaultMode("output"), "values");
  assert.equal(defaultMode("gradient"), "magnitude");
  assert.equal(defaultMode("output_gradient"), "magnitude");
  assert.equal(defaultMode("unknown"), MODES[0].id);
});

test("quantileField matches Python's f\"{q:g}\" (metadata.quantile_field)", () => {
  // Values printed by Python: f"{float(q):g}" for each q.
  const python = [[50, "50"], [2.5, "2.5"], [12.3456789, "12.3457"], [99.9, "99.9"], [0.001, "0.001"],
    [100, "100"], [0.1 + 0.2, "0.3"], [33.33333333, "33.3333"]];
  for (const [q, text] of python) {
    assert.equal(quantileField(q, false), `q${text}`);
    assert.equal(quantileField(q, true), `logq${text}`);
  }
  assert.equal(ilrField(2.5), "ilr_q2.5");
});

test("fieldsFor: the slots each mode's chart requests", () => {
  assert.deepEqual(fieldsFor("values", QS), ["q5", "q25", "q50", "q75", "q95"]);
  assert.deepEqual(fieldsFor("magnitude", [50]), ["logq50", "zero_fraction", "sign_balance"]);
  assert.deepEqual(fieldsFor("rms", QS), ["rms"]);
  assert.deepEqual(fieldsFor("update", QS, ["mean"]), ["update_ratio", "mean"]);
  assert.deepEqual(fieldsFor("cos", QS), ["cos_prev"]);
  assert.deepEqual(fieldsFor("ilr", [5, 95]), ["ilr_q5", "ilr_q95"]);
});

test("fieldsFor: an unknown mode falls back to RMS", () => {
  assert.deepEqual(fieldsFor("nope", QS, ["x"]), ["rms", "x"]);
});

test("modesOfView: slot modes only in their own view, ILR only when logged", () => {
  const variable = modesOfView("variable", { ilr: true });
  assert.ok(variable.includes("update") && variable.includes("ilr") && !variable.includes("cos"));
  assert.ok(!modesOfView("variable", {}).includes("ilr"));
  assert.ok(!modesOfView("variable", undefined).includes("ilr"));
  const gradient = modesOfView("gradient", { ilr: true });
  assert.ok(gradient.includes("cos") && !gradient.includes("update") && !gradient.includes("ilr"));
  assert.deepEqual(modesOfView("output", { ilr: true }), ["values", "magnitude", "rms"]);
});

test("modesFor: a tensor gets a slot or prefix mode only when its layout has the slot", () => {
  const plain = modesFor({ fields: ["rms", "q50", "logq50"] }, { ilr: true });
  assert.deepEqual(plain, ["values", "magnitude", "rms"]);
  const weights = modesFor({ fields: ["rms", "update_ratio", "ilr_q50"] }, { ilr: true });
  assert.ok(weights.includes("update") && weights.includes("ilr") && !weights.includes("cos"));
  assert.ok(!modesFor({ fields: ["ilr_q50"] }, {}).includes("ilr"));
  assert.ok(modesFor({ fields: ["cos_prev"] }, {}).includes("cos"));
  assert.deepEqual(modesFor({}, {}), ["values", "magnitude", "rms"]);
});
