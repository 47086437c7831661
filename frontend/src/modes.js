// The Layers view's chart modes: one table that the mode buttons, the fields a
// panel requests, the help texts and the URL state (state.js: `lmode`) all read.
// A new mode is one entry here, its texts in tb_introspect/schema.py (CHARTS)
// and, unless it plots a single slot, its drawing function in views/layers.js.

import { CHARTS, ILR_PREFIX } from "./schema.js";
import { ilrField, quantileField } from "./slots.js";

/** Mode `id`'s texts from the schema: `label`, `help` and, for some, `readout`. */
const text = (id) => CHARTS[`layers.${id}`];

/**
 * id: the URL value; from the schema, label: the button text, help: the
 * button's tooltip, readout: the readout's label of a one-slot chart;
 * fields(quantiles): the statistics slots its chart needs;
 * defaultFor: the views that open in this mode;
 * slot: a mode that plots one view-specific slot (only offered where the
 * writer logged it), with its reference line and axis;
 * view + prefix: a mode of one view whose slots all start with `prefix`
 * (only offered for tensors whose layout has them);
 * logged(ovView): whether the run holds data for it, from the view's entry of
 * the `./overview` document (a mode whose slots are all NaN is not offered).
 */
export const MODES = [
  {
    id: "values",
    ...text("values"),
    fields: (qs) => qs.map((q) => quantileField(q, false)),
    // The article's advice: weights and outputs read best as values, gradients as magnitudes.
    defaultFor: ["variable", "output"],
  },
  {
    id: "magnitude",
    ...text("magnitude"),
    fields: (qs) => [...qs.map((q) => quantileField(q, true)), "zero_fraction", "sign_balance"],
    defaultFor: ["gradient", "output_gradient"],
  },
  {
    id: "rms",
    ...text("rms"),
    fields: () => ["rms"],
  },
  {
    id: "update",
    ...text("update"),
    slot: { field: "update_ratio", view: "variable", ref: 1e-3, refLabel: "1e-3", log: true,
      none: "there is no update ratio: it needs two logged points of a non-zero weight" },
  },
  {
    id: "cos",
    ...text("cos"),
    slot: { field: "cos_prev", view: "gradient", ref: 0, refLabel: "0", range: [-1, 1],
      none: "there is no cosine: it needs this window's and the previous one's gradient sums, both non-zero" },
  },
  {
    id: "ilr",
    ...text("ilr"),
    view: "variable",
    prefix: ILR_PREFIX,
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
