import test from "node:test";
import assert from "node:assert/strict";

import {
  EpochMap, VIEWS, VIEW_LABELS, compileFilter, joinParts, nearestIndex, percentileStep, pointLabel, sampleBudget, sampleNote,
  shapeText, xValues,
} from "../src/common.js";
import { DEFAULT_QUANTILES, VIEWS as SCHEMA_VIEWS } from "../src/schema.js";

// Ten steps, five per epoch: epoch 0 ends at step 4, epoch 1 at step 9.
const STEPS = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9];
const EPOCHS = [0, 0, 0, 0, 0, 1, 1, 1, 1, 1];

test("EpochMap: an epoch's last step sits at epoch + 1, steps spread evenly inside", () => {
  const m = new EpochMap().add(STEPS, EPOCHS);
  assert.equal(m.x(4, 0), 1);
  assert.equal(m.x(2, 0), 0.5);
  assert.equal(m.x(9, 1), 2);
  assert.ok(Math.abs(m.x(7, 1) - 1.6) < 1e-12);
});

test("EpochMap: x grows with the step and stays within [0, epochs]", () => {
  const m = new EpochMap().add(STEPS, EPOCHS);
  const xs = STEPS.map((s, i) => m.x(s, EPOCHS[i]));
  for (let i = 1; i < xs.length; i++) assert.ok(xs[i] > xs[i - 1], `x(${i}) > x(${i - 1})`);
  assert.ok(xs[0] >= 0 && xs.at(-1) === 2);
});

test("EpochMap: no epoch gives null, an unseen epoch its end", () => {
  const m = new EpochMap().add(STEPS, EPOCHS);
  assert.equal(m.x(3, null), null);
  assert.equal(m.x(30, 5), 6);
});

test("EpochMap: empty until a step with an epoch is added; nulls are skipped", () => {
  const m = new EpochMap();
  assert.equal(m.empty, true);
  assert.equal(m.add(null, null), m);
  m.add([1, 2], [null, null]);
  assert.equal(m.empty, true);
  m.add([1, null], [0, 0]);
  assert.equal(m.empty, false);
});

test("xValues: steps as a copy, or epoch progress when asked and known", () => {
  const m = new EpochMap().add(STEPS, EPOCHS);
  const bySteps = xValues("step", STEPS, EPOCHS, m);
  assert.deepEqual(bySteps, STEPS);
  assert.notEqual(bySteps, STEPS);
  assert.deepEqual(xValues("epoch", [2, 9], [0, 1], m), [0.5, 2]);
  assert.deepEqual(xValues("epoch", [2, 9], [0, 1], new EpochMap()), [2, 9]);
  assert.deepEqual(xValues("epoch", [2, 9], null, m), [2, 9]);
});

test("pointLabel: epoch 0 is an epoch, null is none", () => {
  assert.equal(pointLabel(120, 3), "step 120 · epoch 3");
  assert.equal(pointLabel(5, 0), "step 5 · epoch 0");
  assert.equal(pointLabel(5, null), "step 5");
});

test("compileFilter: case-insensitive regex over name, layer and tag", () => {
  const f = compileFilter("dense");
  assert.equal(f.error, null);
  assert.equal(f.test({ name: "Dense_1/kernel:0" }), true);
  assert.equal(f.test({ name: "k", layer: "my_dense" }), true);
  assert.equal(f.test({ name: "k", tag: "introspect/dense" }), true);
  assert.equal(f.test({ name: "conv2d/kernel:0", layer: "conv2d" }), false);
  assert.equal(compileFilter("^conv.*bias$").test({ name: "conv2d/bias" }), true);
});

test("compileFilter: empty matches all; a broken regex reports and matches all", () => {
  assert.equal(compileFilter("").test({ name: "x" }), true);
  const f = compileFilter("(");
  assert.match(f.error, /^invalid regular expression: /);
  assert.equal(f.test({ name: "x" }), true);
});

test("shapeText: dimensions joined by ×, unknown ones as ?", () => {
  assert.equal(shapeText([3, 3, 64]), "3×3×64");
  assert.equal(shapeText([-1, 10]), "?×10");
  assert.equal(shapeText([]), "scalar");
  assert.equal(shapeText(null), "scalar");
});

test("nearestIndex: closest element, first on a tie, -1 when empty", () => {
  assert.equal(nearestIndex([0, 10, 20], 12), 1);
  assert.equal(nearestIndex([0, 10, 20], 100), 2);
  assert.equal(nearestIndex([0, 10], 5), 0);
  assert.equal(nearestIndex([], 5), -1);
});

test("joinParts: one numerically sorted x axis, gaps as null", () => {
  const { x, ys } = joinParts([
    { x: [10, 100, null], y: [1, 2, 3] },
    { x: [9, 100], y: [4, 5] },
  ]);
  assert.deepEqual(x, [9, 10, 100]);
  assert.deepEqual(ys, [[null, 1, 2], [4, null, 5]]);
});

test("sampleBudget: the budget only when the tensor holds more or an unknown count", () => {
  assert.equal(sampleBudget({ num_points: 100 }, 500), 0);
  assert.equal(sampleBudget({ num_points: 500 }, 500), 0);
  assert.equal(sampleBudget({ num_points: 501 }, 500), 500);
  assert.equal(sampleBudget({ num_points: null }, 500), 500);
});

test("sampleNote: says how many points of how many are shown", () => {
  assert.equal(sampleNote({ steps: [1, 2, 3] }, { num_points: 3 }), "");
  assert.equal(sampleNote({ steps: [1, 2] }, { num_points: 10 }), "2 of 10 points shown; drag to zoom for all");
  assert.equal(sampleNote({ steps: [1, 2], sampled: true }, { num_points: null }),
    "2 points shown (a sample); drag to zoom for all");
  assert.equal(sampleNote({ steps: [1, 2] }, { num_points: null }), "");
});

test("percentileStep: the spacing of evenly spaced points from 0 to 100, else null", () => {
  assert.equal(percentileStep(DEFAULT_QUANTILES), 12.5);
  assert.equal(percentileStep([0, 25, 50, 75, 100]), 25);
  assert.equal(percentileStep([0, 100]), 100);
  assert.equal(percentileStep([0, 10, 50, 90, 100]), null);
  assert.equal(percentileStep([5, 50, 95]), null);
  assert.equal(percentileStep([50]), null);
  assert.equal(percentileStep(undefined), null);
});

test("the views and their labels are the schema's", () => {
  assert.equal(VIEWS, SCHEMA_VIEWS);
  assert.deepEqual(Object.keys(VIEW_LABELS), VIEWS);
});
