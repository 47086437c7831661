import test from "node:test";
import assert from "node:assert/strict";

import { DEFAULTS, PLUGIN, dataFromHash, hashWithState, parseState } from "../src/state.js";
import { MODE_IDS } from "../src/modes.js";

// A state with every key away from its default.
const CHANGED = {
  tab: "layers",
  run: "mnist/run 1",
  view: "output_gradient",
  aview: "variable",
  alayer: "conv2d_1",
  aepoch: "3",
  lmode: "ilr",
  filter: "dense|conv",
  x: "epoch",
  y: "linear",
  theme: "dark",
  focus: "dense/kernel:0",
  modes: { "dense/kernel:0": "rms" },
  cmp: ["run a", "run/b"],
};

test("parseState: no data gives the defaults, as a copy", () => {
  const s = parseState(undefined);
  assert.deepEqual(s, DEFAULTS);
  s.modes.x = "rms";
  s.cmp.push("a");
  assert.deepEqual(parseState({}).modes, {});
  assert.deepEqual(DEFAULTS.cmp, []);
});

test("parseState: values outside their allowed sets fall back to the defaults", () => {
  const s = parseState({
    tab: "bogus", view: "weights", aview: "", lmode: "nope", x: "time", y: "sqrt", theme: "blue",
  });
  for (const k of ["tab", "view", "aview", "lmode", "x", "y", "theme"]) assert.equal(s[k], DEFAULTS[k], k);
});

test("parseState: unknown keys and non-string values are ignored", () => {
  const s = parseState({ tab: 5, run: null, nonsense: "layers", __proto__x: "1" });
  assert.deepEqual(s, DEFAULTS);
});

test("parseState: every mode id is a valid lmode, the empty one too", () => {
  for (const id of MODE_IDS) assert.equal(parseState({ lmode: id }).lmode, id);
  assert.equal(parseState({ lmode: "" }).lmode, "");
});

test("parseState: broken JSON in modes/cmp keeps the default without throwing", () => {
  assert.deepEqual(parseState({ modes: "{", cmp: "[\"a\"" }), DEFAULTS);
  assert.deepEqual(parseState({ modes: "[1,2]" }).modes, {});
  assert.deepEqual(parseState({ modes: "null" }).modes, {});
  assert.deepEqual(parseState({ cmp: "{\"a\":1}" }).cmp, []);
});

test("parseState: cmp keeps only the string entries", () => {
  assert.deepEqual(parseState({ cmp: JSON.stringify(["a", 3, null, "b"]) }).cmp, ["a", "b"]);
});

test("round trip: a changed state through the hash comes back equal", () => {
  const hash = hashWithState("", CHANGED, true);
  assert.deepEqual(parseState(dataFromHash(`#${hash}`)), CHANGED);
});

test("round trip: characters of the hash syntax inside values survive", () => {
  const state = { ...DEFAULTS, run: "a&b=c #1 %20 ü", filter: "^x&y=z$", cmp: ["p&q", "r=s"] };
  const hash = hashWithState("", state, false);
  // Three of our keys differ from the defaults: three parts, so no value leaked a separator.
  assert.equal(hash.split("&").length, 3);
  assert.deepEqual(parseState(dataFromHash(hash)), state);
});

test("hashWithState: the default state writes no key", () => {
  assert.equal(hashWithState("", DEFAULTS, false), "");
  assert.equal(hashWithState("", DEFAULTS, true), PLUGIN);
});

test("hashWithState: only non-default keys are written, with the plugin prefix", () => {
  const hash = hashWithState("", { ...DEFAULTS, tab: "compare", y: "linear" }, false);
  assert.deepEqual(hash.split("&").sort(), [`p.${PLUGIN}.tab=compare`, `p.${PLUGIN}.y=linear`]);
});

test("hashWithState: TensorBoard's other keys are kept and our old ones replaced", () => {
  const before = `#scalars&run=abc&p.${PLUGIN}.tab=layers&p.${PLUGIN}.theme=dark&p.other.tab=x`;
  const hash = hashWithState(before, { ...DEFAULTS, theme: "light" }, true);
  assert.equal(hash, `scalars&run=abc&p.other.tab=x&p.${PLUGIN}.theme=light`);
});

test("hashWithState: embedded, the plugin name goes first when the hash has none", () => {
  const hash = hashWithState("#smoothing=0.6", { ...DEFAULTS, tab: "layers" }, true);
  assert.equal(hash, `${PLUGIN}&smoothing=0.6&p.${PLUGIN}.tab=layers`);
  assert.ok(!hashWithState("#smoothing=0.6", DEFAULTS, false).startsWith(PLUGIN));
});

test("dataFromHash: only our prefixed keys, with or without the leading #", () => {
  const hash = `introspect&tab=layers&p.other.tab=compare&p.${PLUGIN}.run=r1`;
  assert.deepEqual(dataFromHash(hash), { run: "r1" });
  assert.deepEqual(dataFromHash(`#${hash}`), { run: "r1" });
  assert.deepEqual(dataFromHash(""), {});
});

test("dataFromHash: a stray % does not throw; the other keys still read", () => {
  const data = dataFromHash(`#p.${PLUGIN}.filter=100%&p.${PLUGIN}.tab=layers&p.${PLUGIN}.run=%E0%A4%A`);
  assert.equal(data.filter, "100%");
  assert.equal(data.run, "%E0%A4%A");
  assert.equal(parseState(data).tab, "layers");
});

test("dataFromHash: garbage falls back to the defaults without throwing", () => {
  for (const hash of ["#", "#&&&", "#%", "#=", `#p.${PLUGIN}.=x`, `#p.${PLUGIN}.modes=%7B`, "#\u0000=\u0000"]) {
    assert.deepEqual(parseState(dataFromHash(hash)), DEFAULTS, hash);
  }
});
