// The histogram of per-channel activation rates (the toolkit's
// plot_channel_stats): 10 bins over 0..100 % and, left of them, a bar of its
// own for the channels that were exactly 0 for every sample (dead). A plain
// canvas: 11 bars with labelled bins, which uPlot's x axis (numeric ticks,
// no category slot) would only fake.

import { pct } from "./format.js";

export const BINS = 10;

/**
 * Counts and summary of channel rates (null = not logged, left out):
 * {n, dead, bins[BINS], mean, min, max}. Exactly 0 counts as dead, not in
 * the first bin; 1 falls in the last bin.
 */
export function rateStats(rates) {
  const bins = new Array(BINS).fill(0);
  let n = 0;
  let dead = 0;
  let sum = 0;
  let min = Infinity;
  let max = -Infinity;
  for (const v of rates || []) {
    if (v == null || !Number.isFinite(v)) continue;
    n++;
    sum += v;
    if (v < min) min = v;
    if (v > max) max = v;
    if (v <= 0) dead++;
    else bins[Math.min(BINS - 1, Math.floor(v * BINS))]++;
  }
  return { n, dead, bins, mean: n ? sum / n : null, min: n ? min : null, max: n ? max : null };
}

/**
 * The overlay line "C channels · mean · min · max · dead %" and its level:
 * "ok" (no dead channel), "some" (orange in the toolkit) or "all" (red).
 */
export function statsLine(s) {
  if (!s.n) return { text: "no channel rates logged", level: "ok" };
  const level = s.dead === 0 ? "ok" : s.dead === s.n ? "all" : "some";
  const text = `${s.n} channel${s.n === 1 ? "" : "s"} · mean ${pct(s.mean)} · min ${pct(s.min)}`
    + ` · max ${pct(s.max)} · dead ${pct(s.dead / s.n)}${s.dead ? ` (${s.dead})` : ""}`;
  return { text, level };
}

const PAD = { left: 38, right: 18, top: 10, bottom: 30 };
// Slots across the plot: the dead bar, half a slot of gap, then the bins.
const SLOTS = BINS + 1.5;

function niceStep(raw) {
  const e = 10 ** Math.floor(Math.log10(raw));
  const m = raw / e;
  return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * e;
}

/**
 * Draws the histogram of `s` (rateStats) on `canvas` at width × height CSS
 * pixels; `hover` is the bar to highlight (-1 = dead, 0..9 = bins, null).
 * Returns the layout that barAt reads.
 */
export function drawHistogram(canvas, s, { width, height, theme: t, hover = null }) {
  const dpr = window.devicePixelRatio || 1;
  canvas.style.width = `${width}px`;
  canvas.style.height = `${height}px`;
  canvas.width = Math.round(width * dpr);
  canvas.height = Math.round(height * dpr);
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, width, height);
  const plotW = width - PAD.left - PAD.right;
  const plotH = height - PAD.top - PAD.bottom;
  const slot = plotW / SLOTS;
  const binsLeft = PAD.left + 1.5 * slot;
  const top = Math.max(1, s.dead, ...s.bins);
  const step = Math.max(1, niceStep(top / 4));
  const yMax = Math.ceil(top / step) * step;
  const y = (v) => PAD.top + plotH - (v / yMax) * plotH;
  const base = y(0);

  ctx.font = `10px ${t.font}`;
  ctx.lineWidth = 1;
  ctx.textAlign = "right";
  ctx.textBaseline = "middle";
  for (let v = 0; v <= yMax + 1e-9; v += step) {
    const py = Math.round(y(v)) + 0.5;
    ctx.strokeStyle = t.grid;
    ctx.beginPath();
    ctx.moveTo(PAD.left, py);
    ctx.lineTo(width - PAD.right, py);
    ctx.stroke();
    ctx.fillStyle = t.axis;
    ctx.fillText(String(v), PAD.left - 5, py);
  }
  ctx.save();
  ctx.translate(10, PAD.top + plotH / 2);
  ctx.rotate(-Math.PI / 2);
  ctx.textAlign = "center";
  ctx.fillText("channels", 0, 0);
  ctx.restore();

  const bars = [{ bar: -1, x: PAD.left + 0.1 * slot, w: 0.8 * slot, count: s.dead }];
  s.bins.forEach((count, k) => bars.push({ bar: k, x: binsLeft + k * slot + 0.06 * slot, w: 0.88 * slot, count }));
  for (const b of bars) {
    const color = b.bar === -1 ? t.dead : t.active;
    const h = base - y(b.count);
    if (b.bar === hover) {
      ctx.fillStyle = t.alpha(t.text, 0.08);
      ctx.fillRect(b.x - 0.06 * slot, PAD.top, b.w + 0.12 * slot, plotH);
    }
    if (b.count > 0) {
      ctx.fillStyle = color;
      // At least 2 px: one channel among 1,280 stays visible.
      ctx.fillRect(b.x, base - Math.max(2, h), b.w, Math.max(2, h));
    }
  }
  ctx.strokeStyle = t.axis;
  ctx.beginPath();
  ctx.moveTo(PAD.left, Math.round(base) + 0.5);
  ctx.lineTo(width - PAD.right, Math.round(base) + 0.5);
  ctx.stroke();

  ctx.fillStyle = t.axis;
  ctx.textAlign = "center";
  ctx.textBaseline = "top";
  ctx.fillStyle = t.dead;
  ctx.fillText("dead", bars[0].x + bars[0].w / 2, base + 5);
  ctx.fillStyle = t.axis;
  for (let k = 0; k <= BINS; k += 2) ctx.fillText(`${k * 10}%`, binsLeft + k * slot, base + 5);
  ctx.fillText("activation rate per channel", binsLeft + (BINS * slot) / 2, base + 17);
  return { bars, top: PAD.top, bottom: base };
}

/** The bar (-1 = dead, 0..9) under CSS x offset `x`, or null. */
export function barAt(layout, x) {
  for (const b of layout.bars) if (x >= b.x - 2 && x <= b.x + b.w + 2) return b.bar;
  return null;
}

/** Readout text of bar `bar` of `s`. */
export function barText(s, bar) {
  const count = bar === -1 ? s.dead : s.bins[bar];
  const share = s.n ? ` (${pct(count / s.n)} of ${s.n})` : "";
  const what = bar === -1 ? "dead (0% of samples)" : `${bar * 10}–${(bar + 1) * 10}%`;
  return `${what}: ${count} channel${count === 1 ? "" : "s"}${share}`;
}
