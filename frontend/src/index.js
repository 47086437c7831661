// Entry point of the Introspect tab. TensorBoard loads this ES module in an
// iframe (plugin_entry.html, <base href="plugin/introspect/">) and calls
// render(). Everything is fetched with relative URLs.

import "./style.css";
import { Api } from "./api.js";
import { destroyCharts, resizeCharts } from "./charts.js";
import { VIEW_LABELS, VIEWS, compileFilter } from "./common.js";
import { clear, h } from "./dom.js";
import { HostChannel } from "./host.js";
import { tensorNameOfTag } from "./slots.js";
import { parseState, readOwnHash, writeState } from "./state.js";
import { applyTheme, watchTheme } from "./theme.js";
import { renderActivity } from "./views/activity.js";
import { renderCompare } from "./views/compare.js";
import { renderLayers } from "./views/layers.js";
import { renderOverview } from "./views/overview.js";

const TABS = [
  ["overview", "Overview"],
  ["layers", "Layers"],
  ["activity", "Activity"],
  ["compare", "Compare"],
];

function loadStyles() {
  // esbuild writes the bundled CSS next to the module; the backend serves it
  // under ./static/ (relative to the iframe's <base href>).
  return new Promise((resolve) => {
    const link = h("link", { rel: "stylesheet", href: new URL("static/index.css", document.baseURI).href });
    link.addEventListener("load", resolve);
    link.addEventListener("error", resolve);
    document.head.append(link);
  });
}

class App {
  constructor() {
    this.api = new Api();
    this.host = new HostChannel();
    this.gen = 0;
    this.runs = [];
    this.state = null;
    this.cleanups = [];
  }

  async start() {
    const [urlData] = await Promise.all([
      this.host.connected ? this.host.send("experimental.GetURLPluginData", null, 1500, null) : null,
      loadStyles(),
    ]);
    // GetURLPluginData is TensorBoard's reader; our own hash is the fallback
    // when the page is opened outside TensorBoard or the host does not answer.
    this.state = parseState(urlData && Object.keys(urlData).length ? urlData : readOwnHash());
    applyTheme(this.state.theme);
    watchTheme(() => this.state.theme, () => this.renderView());
    this.host.listen("experimental.DataReloaded", () => this.reload());
    document.body.classList.add("introspect");
    this.toolbar = h("header.toolbar");
    this.statusEl = h("div.status", { role: "status" });
    this.main = h("main.main");
    document.body.append(h("div.app", this.toolbar, this.statusEl, this.main));
    let resizeTimer = 0;
    window.addEventListener("resize", () => {
      clearTimeout(resizeTimer);
      resizeTimer = setTimeout(resizeCharts, 150);
    });
    await this.loadRuns();
    await this.renderView();
  }

  async loadRuns() {
    try {
      this.runs = (await this.api.runs()).runs || [];
    } catch (e) {
      this.runs = [];
      this.loadError = e;
    }
    const names = this.runs.map((r) => r.run);
    if (names.length && !names.includes(this.state.run)) this.state.run = names[0];
  }

  async reload() {
    // TensorBoard's reload (button or timer): re-read everything, keep the state.
    this.api.invalidate();
    const y = window.scrollY;
    await this.loadRuns();
    await this.renderView();
    window.scrollTo(0, y);
  }

  setState(patch, { render = true } = {}) {
    const before = this.state;
    this.state = { ...this.state, ...patch };
    // Off the critical path: writing TensorBoard's hash wakes its router
    // (tens of ms), and a burst of changes needs only the last write.
    clearTimeout(this.writeTimer);
    this.writeTimer = setTimeout(() => writeState(this.state), 150);
    if (patch.theme && patch.theme !== before.theme) {
      applyTheme(this.state.theme);
    }
    if (render) {
      if (patch.tab && patch.tab !== before.tab) window.scrollTo(0, 0);
      this.renderView();
    }
  }

  /** The current filter if it shows `tag`, else none (a jump must show its target). */
  keepFilter(tag) {
    const t = { tag, name: tensorNameOfTag(tag), layer: "" };
    return compileFilter(this.state.filter).test(t) ? this.state.filter : "";
  }

  status(text, kind = "") {
    this.statusEl.textContent = text || "";
    this.statusEl.className = `status ${kind}`;
  }

  renderToolbar() {
    const s = this.state;
    const tb = clear(this.toolbar);
    tb.append(h("nav.tabs", { role: "tablist" },
      TABS.map(([id, label]) => h(`button.tab${s.tab === id ? ".on" : ""}`, {
        type: "button",
        role: "tab",
        "aria-selected": s.tab === id ? "true" : "false",
        dataset: { tab: id },
        on: { click: () => this.setState({ tab: id, focus: "" }) },
      }, label))));

    const controls = h("div.controls");
    tb.append(controls);
    if (s.tab !== "compare") {
      controls.append(h("label.ctl", "Run ",
        h("select.run-select", {
          on: { change: (e) => this.setState({ run: e.target.value, focus: "" }) },
          disabled: !this.runs.length,
        }, this.runs.map((r) => h("option", { value: r.run, selected: r.run === s.run }, r.run)))));
    }
    if (s.tab !== "overview") {
      const key = s.tab === "activity" ? "aview" : "view";
      const counts = (this.runs.find((r) => r.run === s.run) || {}).views || {};
      controls.append(h("label.ctl", "View ",
        h("select.view-select", { on: { change: (e) => this.setState({ [key]: e.target.value, focus: "" }) } },
          VIEWS.map((v) => h("option", { value: v, selected: s[key] === v },
            `${VIEW_LABELS[v]}${counts[v] != null ? ` (${counts[v]})` : ""}`)))));
      const f = compileFilter(s.filter);
      let timer = 0;
      const input = h("input.filter", {
        type: "search",
        placeholder: "filter tensors (regex)",
        value: s.filter,
        "aria-label": "filter tensors by regular expression",
        title: f.error || "Regular expression on tensor, layer or tag names",
        on: {
          input: (e) => {
            clearTimeout(timer);
            const value = e.target.value;
            const bad = compileFilter(value).error;
            e.target.classList.toggle("bad", !!bad);
            e.target.title = bad || "Regular expression on tensor, layer or tag names";
            if (!bad) timer = setTimeout(() => this.setState({ filter: value }), 300);
          },
        },
      });
      if (f.error) input.classList.add("bad");
      controls.append(input);
    }
    controls.append(
      segmented("x axis", [["step", "step"], ["epoch", "epoch"]], s.x, (v) => this.setState({ x: v })),
      segmented("y scale", [["log", "log"], ["linear", "linear"]], s.y, (v) => this.setState({ y: v }),
        "Log or linear y for RMS and loss charts (magnitude charts are always log10, values always linear)"),
      h("label.ctl", "Theme ",
        h("select.theme-select", { on: { change: (e) => this.setState({ theme: e.target.value }) } },
          [["auto", "auto"], ["light", "light"], ["dark", "dark"]].map(([v, l]) => h("option", { value: v, selected: s.theme === v }, l)))),
    );
  }

  async renderView() {
    const gen = ++this.gen;
    for (const fn of this.cleanups.splice(0)) fn();
    this.renderToolbar();
    destroyCharts(this.main);
    delete this.main.dataset.completeMs;
    clear(this.main);
    document.documentElement.dataset.status = "loading";
    this.main.dataset.tab = this.state.tab;
    const started = performance.now();
    const app = this;
    const ctx = {
      api: this.api,
      // A getter: views read the current state even after a partial update.
      get state() {
        return app.state;
      },
      root: this.main,
      alive: () => gen === this.gen,
      setState: (p, o) => this.setState(p, o),
      status: (t, k) => this.status(t, k),
      onCleanup: (fn) => this.cleanups.push(fn),
      // Grids draw offscreen panels after "ready"; this marks the last one.
      markComplete: () => {
        if (gen === this.gen) this.main.dataset.completeMs = (performance.now() - started).toFixed(1);
      },
      openLayer: (view, tag, mode) => {
        const modes = mode ? { ...this.state.modes, [tag]: mode } : this.state.modes;
        this.setState({ tab: "layers", view, focus: tag, filter: this.keepFilter(tag), modes });
      },
      openActivity: (view, tag) => {
        this.setState({ tab: "activity", aview: view, focus: tag, filter: this.keepFilter(tag) });
      },
    };
    // Cold reads of a big run take the server a while: say so.
    const slow = setTimeout(() => gen === this.gen && this.status("Loading…"), 300);
    this.status("");
    if (!this.runs.length) {
      this.main.append(h("div.empty.big",
        h("h2", "No Introspect data yet"),
        this.loadError ? h("p.error", `Could not list runs: ${this.loadError.message}`) : null,
        h("p", "Log per-layer statistics with tb_introspect (the Keras callback, the custom-loop Introspector, "
          + "or the numpy writer) into this logdir; the tab refreshes when TensorBoard reloads."),
      ));
      document.documentElement.dataset.status = "ready";
      return;
    }
    const render = { overview: renderOverview, layers: renderLayers, activity: renderActivity, compare: renderCompare }[this.state.tab];
    try {
      // Tearing down a grid of ~150 charts and building the next one are two
      // tasks, not one long one: the page answers input in between.
      await new Promise((resolve) => setTimeout(resolve, 0));
      if (gen !== this.gen) return;
      await render(ctx);
      clearTimeout(slow);
      if (gen !== this.gen) return;
      this.status("");
      const ms = performance.now() - started;
      this.main.dataset.renderMs = ms.toFixed(1);
      // "Complete" is never before "ready" (small grids finish drawing first).
      if (this.main.dataset.completeMs) this.main.dataset.completeMs = ms.toFixed(1);
      // Since the iframe's navigation start: what a user waits for on first open.
      this.main.dataset.readyAt = performance.now().toFixed(1);
      document.documentElement.dataset.status = "ready";
    } catch (e) {
      clearTimeout(slow);
      if (gen !== this.gen) return;
      this.status("");
      console.warn("tb-introspect:", e);
      this.main.append(h("div.empty", h("p.error", `Could not load this view: ${e.message}`)));
      document.documentElement.dataset.status = "error";
    }
  }
}

function segmented(label, options, current, onPick, title) {
  return h("div.segmented", { role: "group", "aria-label": label, title: title || label },
    h("span.seg-label", `${label}:`),
    options.map(([value, text]) => h(`button.seg${value === current ? ".on" : ""}`, {
      type: "button",
      dataset: { value },
      "aria-pressed": value === current ? "true" : "false",
      on: { click: () => value !== current && onPick(value) },
    }, text)));
}

let started = false;

export async function render() {
  // TensorBoard calls render() once per iframe; guard against a second call.
  if (started) return;
  started = true;
  await new App().start();
}
