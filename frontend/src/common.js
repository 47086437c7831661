// Helpers shared by the views: x axis by step or epoch, filters, labels.

import { h } from "./dom.js";

// The views, their names and one-line help: the schema's (tb_introspect/schema.py).
export { VIEWS, VIEW_HELP, VIEW_LABELS } from "./schema.js";

/**
 * Maps (step, epoch) to training progress in epochs: a point logged at step s
 * of epoch e sits at e + (s - end(e-1)) / (end(e) - end(e-1)), where end(e) is
 * the last step seen in epoch e. So "x = 2" means "after two epochs", per-step
 * points spread evenly inside their epoch, and an epoch-end point sits at e+1.
 */
export class EpochMap {
  constructor() {
    this.ends = new Map();
    this.firstStep = Infinity;
  }

  add(steps, epochs) {
    if (!steps || !epochs) return this;
    for (let i = 0; i < steps.length; i++) {
      const e = epochs[i];
      const s = steps[i];
      if (e == null || s == null) continue;
      this.firstStep = Math.min(this.firstStep, s);
      if (!(this.ends.get(e) >= s)) this.ends.set(e, s);
    }
    this.sorted = null;
    return this;
  }

  get empty() {
    return this.ends.size === 0;
  }

  x(step, epoch) {
    if (epoch == null) return null;
    const end = this.ends.get(epoch);
    if (end == null) return epoch + 1;
    let prev = this.ends.get(epoch - 1);
    if (prev == null) prev = epoch === 0 ? Math.min(0, this.firstStep) : end - 1;
    const span = end - prev;
    if (span <= 0) return epoch + 1;
    return epoch + Math.max(0, Math.min(1, (step - prev) / span));
  }
}

/** The x values of a series for the chosen axis ("step" | "epoch"). */
export function xValues(mode, steps, epochs, epochMap) {
  if (mode === "epoch" && epochs && epochMap && !epochMap.empty) {
    return steps.map((s, i) => epochMap.x(s, epochs[i]));
  }
  return steps.slice();
}

/**
 * The spacing of evenly spaced percentile points that run from 0 to 100
 * (12.5 for 0, 12.5, …, 100); null when they are not.
 */
export function percentileStep(qs) {
  if (!qs || qs.length < 2 || qs[0] !== 0 || qs.at(-1) !== 100) return null;
  const step = qs[1] - qs[0];
  return qs.every((q, i) => Math.abs(q - i * step) < 1e-9) ? step : null;
}

/** A readout head: "step 120 · epoch 3". */
export function pointLabel(step, epoch) {
  return epoch == null ? `step ${step}` : `step ${step} · epoch ${epoch}`;
}

/** Compiles the filter; returns {test, error}. Matches on tensor name, layer and tag. */
export function compileFilter(text) {
  if (!text) return { test: () => true, error: null };
  try {
    const re = new RegExp(text, "i");
    return { test: (t) => re.test(t.name) || re.test(t.layer || "") || re.test(t.tag || ""), error: null };
  } catch (e) {
    return { test: () => true, error: `invalid regular expression: ${e.message}` };
  }
}

export function shapeText(shape) {
  if (!shape || !shape.length) return "scalar";
  return shape.map((d) => (d < 0 ? "?" : String(d))).join("×");
}

/** A sentence in place of an empty chart box. */
export function emptyNote(text, extra) {
  return h("div.empty", h("p", text), extra ? h("p.hint", extra) : null);
}

/** Index of `value` in `arr`, or -1. */
export function nearestIndex(arr, value) {
  let best = -1;
  let bestD = Infinity;
  for (let i = 0; i < arr.length; i++) {
    const d = Math.abs(arr[i] - value);
    if (d < bestD) {
      bestD = d;
      best = i;
    }
  }
  return best;
}

/** uPlot wants one x array: join parts over the union of their x values. */
export function joinParts(parts) {
  const xs = new Set();
  for (const p of parts) for (const v of p.x) if (v != null) xs.add(v);
  const x = Array.from(xs).sort((a, b) => a - b);
  const pos = new Map(x.map((v, i) => [v, i]));
  const ys = parts.map((p) => {
    const out = new Array(x.length).fill(null);
    p.x.forEach((v, i) => v != null && (out[pos.get(v)] = p.y[i]));
    return out;
  });
  return { x, ys };
}

/**
 * The downsample a grid panel asks for: its point budget when the tensor
 * holds more points, or when the count is unknown (num_points null: the
 * server read a sample of a long run); 0 (every point) otherwise.
 */
export function sampleBudget(tensor, budget) {
  const n = tensor.num_points;
  return n == null || n > budget ? budget : 0;
}

/** The note under a sampled panel ("" when every point is shown). */
export function sampleNote(series, tensor) {
  const shown = series.steps.length;
  const total = tensor.num_points;
  if (!(series.sampled || (total != null && shown < total))) return "";
  return total != null
    ? `${shown} of ${total} points shown; drag to zoom for all`
    : `${shown} points shown (a sample); drag to zoom for all`;
}
