import test from "node:test";
import assert from "node:assert/strict";

import { fmt, isFiniteNum, pct, tick } from "../src/format.js";

test("fmt: exponent form below 1e-3 and from 1e6, trailing zeros dropped", () => {
  assert.equal(fmt(1e-7), "1e-7");
  assert.equal(fmt(-2.5e-5), "-2.5e-5");
  assert.equal(fmt(0.000999), "9.99e-4");
  assert.equal(fmt(1234567), "1.23457e6");
});

test("fmt: plain form inside [1e-3, 1e6), six significant digits", () => {
  assert.equal(fmt(1e-3), "0.001");
  assert.equal(fmt(0.5), "0.5");
  assert.equal(fmt(123.456789), "123.457");
  assert.equal(fmt(999999), "999999");
});

test("fmt: an integer keeps its zeros (only decimals are trimmed)", () => {
  assert.equal(fmt(100), "100");
  // Six digits of 100000 print with no decimal point: nothing to trim.
  assert.equal(fmt(100000), "100000");
  assert.equal(fmt(120, 3), "120");
  assert.equal(fmt(-2000), "-2000");
  assert.equal(fmt(10.5), "10.5");
});

test("fmt: missing, NaN, infinities and zero", () => {
  assert.equal(fmt(null), "—");
  assert.equal(fmt(undefined), "—");
  assert.equal(fmt(NaN), "NaN");
  assert.equal(fmt(Infinity), "+Inf");
  assert.equal(fmt(-Infinity), "−Inf");
  assert.equal(fmt(0), "0");
  assert.equal(fmt(-0), "0");
});

test("fmt: the digits argument sets the significant digits", () => {
  assert.equal(fmt(Math.PI, 3), "3.14");
  assert.equal(fmt(Math.PI * 1e-6, 3), "3.14e-6");
});

test("pct: one decimal by default, dash for what is not a finite number", () => {
  assert.equal(pct(0.1234), "12.3%");
  assert.equal(pct(1), "100.0%");
  assert.equal(pct(0), "0.0%");
  assert.equal(pct(0.5, 0), "50%");
  assert.equal(pct(null), "—");
  assert.equal(pct(NaN), "—");
  assert.equal(pct(Infinity), "—");
});

test("tick: compact labels across magnitudes", () => {
  assert.equal(tick(0), "0");
  assert.equal(tick(0.01), "0.01");
  assert.equal(tick(250), "250");
  assert.equal(tick(1234), "1230");
  assert.equal(tick(15000), "15k");
  assert.equal(tick(250000), "250k");
  assert.equal(tick(1e-4), "1e-4");
  assert.equal(tick(5e-5), "5e-5");
  assert.equal(tick(1e6), "1e6");
  assert.equal(tick(2.5e7), "2.5e7");
  assert.equal(tick(-1e-4), "−1e-4");
});

test("tick: every power of ten from 1e-30 to 1e30 outside the plain range reads 1eN", () => {
  for (let e = -30; e <= 30; e++) {
    if (e >= -2 && e < 6) continue;
    assert.equal(tick(10 ** e), `1e${e}`, `10^${e}`);
  }
});

test("tick: empty label for values that cannot be drawn", () => {
  assert.equal(tick(null), "");
  assert.equal(tick(NaN), "");
  assert.equal(tick(Infinity), "");
});

test("isFiniteNum accepts finite numbers only", () => {
  assert.equal(isFiniteNum(0), true);
  assert.equal(isFiniteNum(-1.5e-300), true);
  assert.equal(isFiniteNum(NaN), false);
  assert.equal(isFiniteNum(Infinity), false);
  assert.equal(isFiniteNum("1"), false);
  assert.equal(isFiniteNum(null), false);
});
