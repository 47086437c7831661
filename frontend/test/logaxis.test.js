import test from "node:test";
import assert from "node:assert/strict";

import { logSplits, positiveOnly, safeLogRange } from "../src/logaxis.js";

const BAD = [undefined, null, 0, -1, NaN, Infinity, -Infinity, "1"];
const GOOD = [1e-320, 1e-300, 1e-40, 1e-3, 1, 7, 1e10, 1e300, Number.MAX_VALUE];

const near = (a, b) => Math.abs(a - b) <= 1e-12 * Math.max(Math.abs(a), Math.abs(b));

test("positiveOnly: non-positive and non-finite values become gaps", () => {
  assert.deepEqual(positiveOnly([1, 0, -1, null, NaN, Infinity, 2e-40]), [1, null, null, null, null, null, 2e-40]);
});

test("safeLogRange: a valid range passes unchanged", () => {
  assert.deepEqual(safeLogRange(1e-3, 10), [1e-3, 10]);
  assert.deepEqual(safeLogRange(1e-40, 1), [1e-40, 1]);
});

test("safeLogRange: bad bounds fall back to the other bound's decade or [1, 10]", () => {
  assert.deepEqual(safeLogRange(0, 10), [1, 10]);
  assert.deepEqual(safeLogRange(-5, 100), [10, 100]);
  assert.deepEqual(safeLogRange(NaN, NaN), [1, 10]);
  assert.deepEqual(safeLogRange(1, Infinity), [1, 10]);
  assert.deepEqual(safeLogRange(5, 5), [5, 50]);
  assert.deepEqual(safeLogRange(10, 1), [10, 100]);
});

test("safeLogRange: any pair of inputs gives finite, positive lo < hi", () => {
  for (const a of [...BAD, ...GOOD]) {
    for (const b of [...BAD, ...GOOD]) {
      const [lo, hi] = safeLogRange(a, b);
      const what = `${String(a)}, ${String(b)} -> ${lo}, ${hi}`;
      assert.ok(Number.isFinite(lo) && Number.isFinite(hi) && lo > 0 && hi > lo, what);
    }
  }
});

test("logSplits: two decades get 1-2-5 ticks", () => {
  assert.deepEqual(logSplits(1, 100), [1, 2, 5, 10, 20, 50, 100]);
});

test("logSplits: forty decades are thinned to every seventh decade", () => {
  // ceil(40 / 6) = 7 decades a tick, from the first multiple of 7 at or above -40.
  const ticks = logSplits(1e-40, 1);
  assert.deepEqual(ticks.map((v) => Math.round(Math.log10(v))), [-35, -28, -21, -14, -7, 0]);
});

test("logSplits: inside one decade, 1-2-3-5-7 multiples or the two ends", () => {
  const ticks = logSplits(0.2, 0.8);
  assert.equal(ticks.length, 4);
  [0.2, 0.3, 0.5, 0.7].forEach((v, i) => assert.ok(near(ticks[i], v), `${ticks[i]} ~ ${v}`));
  assert.deepEqual(logSplits(0.41, 0.45), [0.41, 0.45]);
});

test("logSplits: bounded, increasing ticks inside the range, covering the range", () => {
  const ranges = [[1e-40, 1], [1e-3, 1e3], [1, Infinity], [0, 0], [1e-300, 1e300], [3, 4e7], [1e-320, 1e-310]];
  for (const [a, b] of ranges) {
    for (const maxTicks of [2, 6, 12]) {
      const [lo, hi] = safeLogRange(a, b);
      const ticks = logSplits(a, b, maxTicks);
      const what = `[${a}, ${b}] max ${maxTicks}: ${ticks}`;
      // Six or more allowed: at least two labels to read the scale off.
      assert.ok(ticks.length >= (maxTicks >= 6 ? 2 : 1), what);
      // At most one tick per decade step plus one, times 5 multiples when the range is short.
      assert.ok(ticks.length <= 5 * (maxTicks + 2), what);
      for (let i = 1; i < ticks.length; i++) assert.ok(ticks[i] > ticks[i - 1], what);
      assert.ok(ticks[0] >= lo * (1 - 1e-9) && ticks.at(-1) <= hi * (1 + 1e-9), what);
      const decades = Math.ceil(Math.log10(hi)) - Math.floor(Math.log10(lo));
      const every = Math.max(1, Math.ceil(decades / maxTicks));
      // Covering: no gap between ticks, or between an end and its nearest tick, over the step.
      const edges = [lo, ...ticks, hi];
      for (let i = 1; i < edges.length; i++) {
        assert.ok(Math.log10(edges[i] / edges[i - 1]) <= every + 1e-9, what);
      }
    }
  }
});
