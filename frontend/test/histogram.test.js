import test from "node:test";
import assert from "node:assert/strict";

import { BINS, barAt, barText, rateStats, statsLine } from "../src/histogram.js";

test("rateStats: 0 is dead, not in the first bin; 1 is in the last bin; null/NaN left out", () => {
  const s = rateStats([0, 0.05, 0.15, 1, null, NaN, 0.5]);
  assert.equal(s.n, 5);
  assert.equal(s.dead, 1);
  const bins = new Array(BINS).fill(0);
  bins[0] = 1;
  bins[1] = 1;
  bins[5] = 1;
  bins[BINS - 1] = 1;
  assert.deepEqual(s.bins, bins);
  assert.ok(Math.abs(s.mean - 1.7 / 5) < 1e-12);
  assert.equal(s.min, 0);
  assert.equal(s.max, 1);
});

test("rateStats: every counted channel is dead or in exactly one bin", () => {
  const rates = Array.from({ length: 1280 }, (_, i) => (i % 7 === 0 ? 0 : (i % 101) / 100));
  const s = rateStats(rates);
  assert.equal(s.n, 1280);
  assert.equal(s.dead + s.bins.reduce((a, b) => a + b, 0), s.n);
  assert.ok(s.min >= 0 && s.max <= 1 && s.mean > s.min && s.mean < s.max);
});

test("rateStats: nothing logged gives n = 0 and null summaries", () => {
  for (const input of [[], null, [null, NaN, Infinity]]) {
    const s = rateStats(input);
    assert.deepEqual([s.n, s.dead, s.mean, s.min, s.max], [0, 0, null, null, null]);
  }
});

test("statsLine: level ok / some / all by the dead share", () => {
  assert.equal(statsLine(rateStats([0.5, 0.9])).level, "ok");
  assert.equal(statsLine(rateStats([0, 0.9])).level, "some");
  assert.equal(statsLine(rateStats([0, 0])).level, "all");
  assert.deepEqual(statsLine(rateStats([])), { text: "no channel rates logged", level: "ok" });
});

test("statsLine: the summary text, singular and with the dead count", () => {
  assert.equal(statsLine(rateStats([0.5])).text,
    "1 channel · mean 50.0% · min 50.0% · max 50.0% · dead 0.0%");
  assert.equal(statsLine(rateStats([0, 0.5, 1, 0.5])).text,
    "4 channels · mean 50.0% · min 0.0% · max 100.0% · dead 25.0% (1)");
});

test("barText: the bar's range, count and share", () => {
  const s = rateStats([0, 0.5, 0.55, 0.9]);
  assert.equal(barText(s, -1), "dead (0% of samples): 1 channel (25.0% of 4)");
  assert.equal(barText(s, 5), "50–60%: 2 channels (50.0% of 4)");
  assert.equal(barText(s, 0), "0–10%: 0 channels (0.0% of 4)");
  assert.equal(barText(rateStats([]), 3), "30–40%: 0 channels");
});

test("barAt: the bar under x with 2 px of slack, null between bars", () => {
  const layout = { bars: [{ bar: -1, x: 10, w: 20 }, { bar: 0, x: 40, w: 20 }] };
  assert.equal(barAt(layout, 25), -1);
  assert.equal(barAt(layout, 31), -1);
  assert.equal(barAt(layout, 35), null);
  assert.equal(barAt(layout, 39), 0);
  assert.equal(barAt(layout, 63), null);
});
