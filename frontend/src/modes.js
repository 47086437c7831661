// The Layers view's chart modes: one table that the mode buttons, the fields a
// panel requests, the help texts and the URL state (state.js: `lmode`) all read.
// A new mode is one entry here plus, unless it plots a single slot, its drawing
// function in views/layers.js.

/**
 * id: the URL value; label: the button text; help: the button's tooltip;
 * fields(quantiles): the statistics slots its chart needs;
 * defaultFor: the views that open in this mode;
 * slot: a mode that plots one view-specific slot (only offered where the
 * writer logged it), with its reference line, axis and readout label;
 * view + prefix: a mode of one view whose slots all start with `prefix`
 * (only offered for tensors whose layout has them);
 * logged(ovView): whether the run holds data for it, from the view's entry of
 * the `./overview` document (a mode whose slots are all NaN is not offered).
 */
export const MODES = [
  {
    id: "values",
    label: "values",
    help: "percentiles of the values (linear axis)",
    fields: (qs) => qs.map((q) => quantileField(q, false)),
    // The article's advice: weights and outputs read best as values, gradients as magnitudes.
    defaultFor: ["variable", "output"],
  },
  {
    id: "magnitude",
    label: "|x| log",
    help: "percentiles of |x| on a log axis (zeros at the bottom); right axis: orange = sign balance of the"
      + " non-zero values (−100%…+100%; a ReLU output reads +100%), dashed grey = share of exact zeros (0…100%)",
    fields: (qs) => [...qs.map((q) => quantileField(q, true)), "zero_fraction", "sign_balance"],
    defaultFor: ["gradient", "output_gradient"],
  },
  {
    id: "rms",
    label: "RMS",
    help: "RMS = L2 norm / √size, comparable across layers",
    fields: () => ["rms"],
  },
  {
    id: "update",
    label: "Δw/w",
    help: "update-to-weight ratio ‖Δw‖/‖w‖ between logged points (log axis; ~1e-3 per step is the usual rule of thumb)",
    slot: { field: "update_ratio", view: "variable", ref: 1e-3, refLabel: "1e-3", log: true, readout: "‖Δw‖/‖w‖" },
  },
  {
    id: "cos",
    label: "cos",
    help: "cosine between consecutive gradient aggregates (−1…1; persistently negative = oscillation)",
    slot: { field: "cos_prev", view: "gradient", ref: 0, refLabel: "0", range: [-1, 1], readout: "cos to previous" },
  },
  {
    id: "ilr",
    label: "ILR",
    help: "implicit learning rate |Δw| / |Σg| per element between logged points (Σg: the sum of the gradients in between): percentiles over the"
      + " elements (log axis). Plain SGD: every percentile is the learning rate (with momentum m about"
      + " rate / (1 − m)); Adam/RMSprop: the spread is the per-element step sizes, about rate / |g|. Compare"
      + " layers: one far from the others is scaled by something else (clipping, its own rate, no update)",
    view: "variable",
    prefix: "ilr_",
    fields: (qs) => qs.map((q) => ilrField(q)),
    logged: (ovView) => !!(ovView && ovView.ilr),
  },
];

export const MODE_IDS = MODES.map((m) => m.id);
const BY_ID = new Map(MODES.map((m) => [m.id, m]));

/** The table entry of mode `id` (undefined for an unknown one). */
export function mode(id) {
  return BY_ID.get(id);
}

/** The mode a view opens in. */
export function defaultMode(view) {
  return (MODES.find((m) => m.defaultFor && m.defaultFor.includes(view)) || MODES[0]).id;
}

/** The view a mode belongs to (undefined: every view). */
function viewOf(m) {
  return m.slot ? m.slot.view : m.view;
}

/**
 * The modes offered for every panel of a view (a slot mode only in its own
 * view); `ovView`, the view's `./overview` entry, drops modes without data.
 */
export function modesOfView(view, ovView) {
  return MODES.filter((m) => (!viewOf(m) || viewOf(m) === view) && (!m.logged || m.logged(ovView)))
    .map((m) => m.id);
}

/**
 * The modes a tensor supports: a slot mode needs its slot in the tensor's
 * layout, a prefix mode one slot with that prefix; `ovView` as for modesOfView.
 */
export function modesFor(tensor, ovView) {
  const fields = tensor.fields || [];
  const has = (m) => m.slot ? fields.includes(m.slot.field)
    : m.prefix ? fields.some((f) => f.startsWith(m.prefix)) : true;
  return MODES.filter((m) => has(m) && (!m.logged || m.logged(ovView))).map((m) => m.id);
}

/** The slots a panel in mode `id` requests, plus `extra` ones. */
export function fieldsFor(id, quantiles, extra = []) {
  const m = mode(id) || mode("rms");
  return [...(m.slot ? [m.slot.field] : m.fields(quantiles)), ...extra];
}

/** The implicit-learning-rate slot of percentile `q` (metadata.ILR_PREFIX + quantile_field). */
export function ilrField(q) {
  return `ilr_${quantileField(q, false)}`;
}

/** Matches metadata.quantile_field: Python's f"{q:g}" for the quantile. */
export function quantileField(q, log) {
  return `${log ? "logq" : "q"}${String(Number(q.toPrecision(6)))}`;
}
