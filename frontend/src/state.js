// UI state, kept in TensorBoard's URL hash as plugin data (`p.introspect.KEY`),
// so a copied link or a page reload restores the same tab, run and settings.
// TensorBoard only offers a *reader* (experimental.GetURLPluginData); the
// plugin iframe is same-origin, so we write the parent's hash directly with
// history.replaceState (no history entries, no navigation) and fire a
// hashchange so TensorBoard's tf_storage re-reads the hash.

import { MODE_IDS } from "./modes.js";
import { PLUGIN_NAME, VIEWS } from "./schema.js";

/** TensorBoard's name of the plugin: the hash keys are `p.<PLUGIN>.<key>`. */
export const PLUGIN = PLUGIN_NAME;

export const DEFAULTS = {
  tab: "overview",
  run: "",
  view: "gradient",
  aview: "output",
  // Activity view's map: layer output name ("" = the default) and epoch ("" = the last).
  alayer: "",
  aepoch: "",
  lmode: "",
  filter: "",
  x: "step",
  y: "log",
  theme: "auto",
  focus: "",
  modes: {},
  cmp: [],
};

const JSON_KEYS = new Set(["modes", "cmp"]);
const TABS = ["overview", "layers", "activity", "compare"];

/** Parse `{key: string}` URL data into a validated state object. */
export function parseState(data) {
  const s = structuredClone(DEFAULTS);
  for (const [k, v] of Object.entries(data || {})) {
    if (!(k in DEFAULTS) || typeof v !== "string") continue;
    if (JSON_KEYS.has(k)) {
      try {
        const parsed = JSON.parse(v);
        if (k === "modes" && parsed && typeof parsed === "object" && !Array.isArray(parsed)) s.modes = parsed;
        if (k === "cmp" && Array.isArray(parsed)) s.cmp = parsed.filter((r) => typeof r === "string");
      } catch {
        /* a hand-edited, broken value: keep the default */
      }
    } else {
      s[k] = v;
    }
  }
  if (!TABS.includes(s.tab)) s.tab = DEFAULTS.tab;
  if (!VIEWS.includes(s.view)) s.view = DEFAULTS.view;
  if (!VIEWS.includes(s.aview)) s.aview = DEFAULTS.aview;
  if (s.lmode !== "" && !MODE_IDS.includes(s.lmode)) s.lmode = DEFAULTS.lmode;
  if (!["step", "epoch"].includes(s.x)) s.x = DEFAULTS.x;
  if (!["log", "linear"].includes(s.y)) s.y = DEFAULTS.y;
  if (!["auto", "light", "dark"].includes(s.theme)) s.theme = DEFAULTS.theme;
  return s;
}

function serialise(state) {
  const out = {};
  for (const [k, def] of Object.entries(DEFAULTS)) {
    const v = state[k];
    if (JSON_KEYS.has(k)) {
      const text = JSON.stringify(v);
      if (text !== JSON.stringify(def)) out[k] = text;
    } else if (v !== def && v != null) {
      out[k] = String(v);
    }
  }
  return out;
}

// TensorBoard's hash: "#plugin&key=value&key=value" (tf_storage format).
function parseHash(hash) {
  const parts = hash.replace(/^#/, "").split("&").filter(Boolean);
  const dict = [];
  for (const p of parts) {
    const i = p.indexOf("=");
    if (i < 0) dict.push([null, p]);
    else dict.push([decode(p.slice(0, i)), decode(p.slice(i + 1))]);
  }
  return dict;
}

// A hand-edited hash may hold a stray "%": keep that part as typed rather
// than let a URIError stop the tab from starting.
function decode(text) {
  try {
    return decodeURIComponent(text);
  } catch {
    return text;
  }
}

function formatHash(entries) {
  return entries
    .map(([k, v]) => (k === null ? v : `${encodeURIComponent(k)}=${encodeURIComponent(v)}`))
    .join("&");
}

/** The window whose hash holds the state: TensorBoard's page, or our own when opened bare. */
function hashWindow() {
  try {
    if (window.parent !== window && window.parent.location.href) return window.parent;
  } catch {
    /* cross-origin parent (unusual proxy setup): keep state in our own hash */
  }
  return window;
}

/** Our keys' `{key: string}` data in a hash string, without the `p.introspect.` prefix. */
export function dataFromHash(hash) {
  const prefix = `p.${PLUGIN}.`;
  const data = {};
  for (const [k, v] of parseHash(hash)) {
    if (k && k.startsWith(prefix)) data[k.slice(prefix.length)] = v;
  }
  return data;
}

/**
 * `hash` with our keys replaced by the non-default values of `state`, other
 * keys kept; `embedded` (TensorBoard's page) puts the plugin name first when
 * the hash has none, as tf_storage expects.
 */
export function hashWithState(hash, state, embedded) {
  const prefix = `p.${PLUGIN}.`;
  const kept = parseHash(hash).filter(([k]) => !(k && k.startsWith(prefix)));
  if (embedded && !kept.some(([k]) => k === null)) kept.unshift([null, PLUGIN]);
  const ours = Object.entries(serialise(state)).map(([k, v]) => [prefix + k, v]);
  return formatHash([...kept, ...ours]);
}

/** Reads our keys straight from the hash (used when not embedded in TensorBoard). */
export function readOwnHash() {
  return dataFromHash(hashWindow().location.hash);
}

let lastWritten = null;

export function writeState(state) {
  const w = hashWindow();
  const hash = hashWithState(w.location.hash, state, w !== window);
  if (hash === lastWritten || hash === w.location.hash.replace(/^#/, "")) return;
  lastWritten = hash;
  try {
    const url = new URL(w.location.href);
    url.hash = hash;
    w.history.replaceState(w.history.state, "", url.toString());
    if (w !== window) w.dispatchEvent(new HashChangeEvent("hashchange"));
  } catch {
    /* the host refused: state just is not kept in the URL */
  }
}
