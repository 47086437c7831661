// The frontend keeps no copy of the schema (src/schema.js, generated from
// tb_introspect/metadata.py and schema.py): these checks read every other source file.
import test from "node:test";
import assert from "node:assert/strict";
import { readdirSync, readFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

import {
  ACTIVITY_FIELDS, BASE_FIELDS, CHARTS, FORMULAS, METRIC_EPOCH_BAND_FIELDS, METRIC_EPOCH_FIELDS, NONFINITE_FIELDS,
  SLOT_HELP, SLOT_LABELS, VIEWS, VIEW_EXTRA_FIELDS, VIEW_HELP, VIEW_LABELS, WINDOW_STEP_FIELDS,
} from "../src/schema.js";
import { DEFAULTS } from "../src/state.js";

const SRC = path.join(path.dirname(fileURLToPath(import.meta.url)), "..", "src");

function sources() {
  const out = [];
  const walk = (dir) => {
    for (const e of readdirSync(dir, { withFileTypes: true })) {
      const p = path.join(dir, e.name);
      if (e.isDirectory()) walk(p);
      else if (e.name.endsWith(".js") && p !== path.join(SRC, "schema.js")) out.push([path.relative(SRC, p), readFileSync(p, "utf8")]);
    }
  };
  walk(SRC);
  return out;
}

const quoted = (s) => [`"${s}"`, `'${s}'`, `\`${s}\``];

test("no source but schema.js spells a formula, Σg or a chart text of the schema", () => {
  const texts = [
    ...Object.values(FORMULAS), "Σg",
    ...Object.values(CHARTS).map((c) => c.help),
    ...Object.values(SLOT_HELP), ...Object.values(VIEW_HELP),
  ];
  for (const [file, text] of sources()) {
    for (const t of texts) assert.ok(!text.includes(t), `${file} holds its own copy of “${t}”`);
    for (const t of Object.values(VIEW_LABELS)) {
      for (const q of quoted(t)) assert.ok(!text.includes(q), `${file} holds the view label ${q}`);
    }
  }
});

test("no source but schema.js lists slot names, views or the naming rules of the format", () => {
  // Slots the code names only through the schema's lists (a reference to one slot, such
  // as `s.values.rms`, is no copy; a quoted name in a list is).
  const listed = [...NONFINITE_FIELDS, ...ACTIVITY_FIELDS, ...WINDOW_STEP_FIELDS];
  const patterns = [
    /["'`]logq/, /["'`]ilr_/, /["'`]introspect\//, /introspect\\\//,
    /\[\s*["']variable["'],\s*["']gradient["']/, /["']p25["']/,
  ];
  for (const [file, text] of sources()) {
    for (const f of listed) for (const q of quoted(f)) assert.ok(!text.includes(q), `${file} names ${q}`);
    for (const re of patterns) assert.ok(!re.test(text), `${file} matches ${re}`);
  }
});

test("the schema's lists agree with each other", () => {
  for (const f of [...NONFINITE_FIELDS, ...ACTIVITY_FIELDS]) assert.ok(BASE_FIELDS.includes(f), f);
  for (const f of WINDOW_STEP_FIELDS) assert.ok(VIEW_EXTRA_FIELDS.output.includes(f), f);
  assert.deepEqual(Object.keys(VIEW_EXTRA_FIELDS), VIEWS);
  assert.deepEqual(Object.keys(VIEW_LABELS), VIEWS);
  assert.deepEqual(Object.keys(VIEW_HELP), VIEWS);
  for (const f of Object.keys(SLOT_LABELS)) assert.ok(BASE_FIELDS.includes(f), f);
  for (const f of METRIC_EPOCH_BAND_FIELDS) assert.ok(METRIC_EPOCH_FIELDS.includes(f), f);
  assert.ok(CHARTS["overview.ilr"].help.startsWith(FORMULAS.implicit_lr));
  assert.ok(CHARTS["layers.ilr"].help.includes(FORMULAS.implicit_lr));
});

test("the state's default views are views of the schema", () => {
  assert.ok(VIEWS.includes(DEFAULTS.view) && VIEWS.includes(DEFAULTS.aview));
});
