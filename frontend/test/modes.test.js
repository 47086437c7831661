import test from "node:test";
import assert from "node:assert/strict";

import { MODES, MODE_IDS, defaultMode, fieldsFor, mode, modesFor, modesOfView } from "../src/modes.js";
import { BASE_FIELDS, CHARTS, ILR_PREFIX, VIEWS, VIEW_EXTRA_FIELDS } from "../src/schema.js";

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

test("every mode has its texts in the schema, and every Layers text of the schema a mode", () => {
  for (const m of MODES) {
    assert.ok(m.label && m.help, m.id);
    assert.deepEqual({ label: m.label, help: m.help, readout: m.readout }, {
      label: CHARTS[`layers.${m.id}`].label, help: CHARTS[`layers.${m.id}`].help, readout: CHARTS[`layers.${m.id}`].readout,
    });
  }
  const layers = Object.keys(CHARTS).filter((k) => k.startsWith("layers.")).map((k) => k.slice("layers.".length));
  assert.deepEqual(layers.sort(), [...MODE_IDS].sort());
  // A one-slot chart needs its readout label; the update ratio's is the formula.
  for (const m of MODES.filter((x) => x.slot)) assert.ok(m.readout, m.id);
  assert.equal(mode("update").readout, "‖Δw‖/‖w‖");
});

test("the slots and views the modes name exist in the schema's layout", () => {
  for (const m of MODES) {
    for (const v of m.defaultFor || []) assert.ok(VIEWS.includes(v), `${m.id}: ${v}`);
    if (m.slot) assert.ok(VIEW_EXTRA_FIELDS[m.slot.view].includes(m.slot.field), m.id);
    if (m.view) assert.ok(VIEWS.includes(m.view), m.id);
    if (!m.slot) {
      for (const f of m.fields([50])) {
        assert.ok(BASE_FIELDS.includes(f) || /^(log)?q50$/.test(f) || f === `${ILR_PREFIX}q50`, `${m.id}: ${f}`);
      }
    }
  }
  assert.equal(mode("ilr").prefix, ILR_PREFIX);
  // Every view opens in some mode of the table.
  for (const v of VIEWS) assert.ok(MODES.some((m) => (m.defaultFor || []).includes(v)), v);
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
