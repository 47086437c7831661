import test from "node:test";
import assert from "node:assert/strict";

import { aliveColor, cellSize, gridOf, mixHex, rateColor, scaleGradient } from "../src/heatmap.js";

// Relative luminance (sRGB, WCAG) of [r, g, b] in 0..255.
function luminance([r, g, b]) {
  const lin = (c) => {
    const s = c / 255;
    return s <= 0.04045 ? s / 12.92 : ((s + 0.055) / 1.055) ** 2.4;
  };
  return 0.2126 * lin(r) + 0.7152 * lin(g) + 0.0722 * lin(b);
}

test("gridOf: 2-D maps as rows × cols, sequences as a one-row strip", () => {
  assert.deepEqual(gridOf([7, 9], 63), { rows: 7, cols: 9, strip: false });
  assert.deepEqual(gridOf([12], 12), { rows: 1, cols: 12, strip: true });
  assert.deepEqual(gridOf([], 10), { rows: 1, cols: 10, strip: true });
  assert.deepEqual(gridOf(null, 5), { rows: 1, cols: 5, strip: true });
});

test("gridOf: rank 3 stacks the leading axes into rows, one cell per position", () => {
  const g = gridOf([2, 3, 4], 24);
  assert.deepEqual(g, { rows: 6, cols: 4, strip: false });
  assert.equal(g.rows * g.cols, 24);
});

test("cellSize: about 280 px a side, capped at 32 px, never under 1 px", () => {
  assert.deepEqual(cellSize({ rows: 7, cols: 7, strip: false }), { w: 32, h: 32 });
  assert.deepEqual(cellSize({ rows: 112, cols: 112, strip: false }), { w: 2, h: 2 });
  assert.deepEqual(cellSize({ rows: 10, cols: 70, strip: false }), { w: 4, h: 4 });
  assert.deepEqual(cellSize({ rows: 1000, cols: 1000, strip: false }), { w: 1, h: 1 });
  assert.deepEqual(cellSize({ rows: 14, cols: 14, strip: false }, 140), { w: 10, h: 10 });
});

test("cellSize: strips are twice as wide, 28 px high", () => {
  assert.deepEqual(cellSize({ rows: 1, cols: 10, strip: true }), { w: 28, h: 28 });
  assert.deepEqual(cellSize({ rows: 1, cols: 100, strip: true }), { w: 5, h: 28 });
  assert.deepEqual(cellSize({ rows: 1, cols: 5000, strip: true }), { w: 1, h: 28 });
});

test("rateColor: viridis ends at 0 and 1, clamped outside", () => {
  assert.deepEqual(rateColor(0), [0x44, 0x01, 0x54]);
  assert.deepEqual(rateColor(1), [0xfd, 0xe7, 0x25]);
  assert.deepEqual(rateColor(-3), rateColor(0));
  assert.deepEqual(rateColor(7), rateColor(1));
});

test("rateColor: a higher rate is a lighter colour (sequential scale)", () => {
  let prev = -1;
  for (let i = 0; i <= 20; i++) {
    const l = luminance(rateColor(i / 20));
    assert.ok(l > prev, `luminance at ${i / 20}`);
    prev = l;
  }
});

test("mixHex: linear mix per channel, f = 0 and 1 give the ends", () => {
  assert.equal(mixHex("#000000", "#ffffff", 0.5), "#808080");
  assert.equal(mixHex("#FF0000", "#0000ff", 0), "#ff0000");
  assert.equal(mixHex("#FF0000", "#0000ff", 1), "#0000ff");
  assert.equal(mixHex("#102030", "#304050", 0.5), "#203040");
  // Not a hex colour: mid grey rather than NaN in the output.
  assert.equal(mixHex("red", "red", 0), "#808080");
});

test("aliveColor: the alive colour above 0, the dead one at exactly 0", () => {
  const c = aliveColor("#00ff00", " #ff0000 ");
  assert.deepEqual(c(0.3), [0, 255, 0]);
  assert.deepEqual(c(1e-9), [0, 255, 0]);
  assert.deepEqual(c(0), [255, 0, 0]);
});

test("scaleGradient: left to right from the 0 colour to the 1 colour", () => {
  const g = scaleGradient();
  assert.match(g, /^linear-gradient\(to right, #440154, .*#fde725\)$/);
});
