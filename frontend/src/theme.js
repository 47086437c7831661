// Light/dark theme. "auto" follows TensorBoard's own dark mode (it toggles
// `dark-mode` on its <body>; our iframe is same-origin so we can watch it),
// else the OS preference. Chart colours come from CSS custom properties so
// style.css is the one place that defines both palettes.

import { VIEWS } from "./schema.js";

let cached = null;

export function theme() {
  if (cached) return cached;
  const css = getComputedStyle(document.documentElement);
  const v = (name) => css.getPropertyValue(name).trim();
  cached = {
    bg: v("--bg"),
    panel: v("--panel"),
    text: v("--text"),
    muted: v("--muted"),
    axis: v("--axis"),
    grid: v("--grid"),
    line: v("--line"),
    accent: v("--accent"),
    font: v("--font-family") || "sans-serif",
    // One colour per view: --c-<view>, "_" written "-" (style.css).
    views: Object.fromEntries(VIEWS.map((view) => [view, v(`--c-${view.replace(/_/g, "-")}`)])),
    active: v("--c-active"),
    dead: v("--c-dead"),
    spatial: v("--c-spatial"),
    sign: v("--c-sign"),
    metric: v("--c-metric"),
    stack: [v("--c-stack-a"), v("--c-stack-b")],
    stackHighlight: v("--c-stack-hi"),
    runs: [1, 2, 3, 4, 5, 6, 7, 8].map((i) => v(`--c-run-${i}`)),
    alpha,
  };
  return cached;
}

/** "#rrggbb" + alpha -> "rgba(...)". */
function alpha(color, a) {
  const m = /^#([0-9a-f]{2})([0-9a-f]{2})([0-9a-f]{2})$/i.exec(color);
  if (!m) return color;
  return `rgba(${parseInt(m[1], 16)},${parseInt(m[2], 16)},${parseInt(m[3], 16)},${a})`;
}

function hostDark() {
  try {
    if (window.parent !== window && window.parent.document.body) {
      return window.parent.document.body.classList.contains("dark-mode");
    }
  } catch {
    /* not same-origin: fall back to the OS preference */
  }
  return null;
}

/** Applies `mode` ("auto" | "light" | "dark"); calls onChange when the effective theme changes. */
export function applyTheme(mode, onChange) {
  let effective = mode;
  if (mode === "auto") {
    const host = hostDark();
    const dark = host ?? window.matchMedia("(prefers-color-scheme: dark)").matches;
    effective = dark ? "dark" : "light";
  }
  const before = document.documentElement.dataset.theme;
  document.documentElement.dataset.theme = effective;
  if (before !== effective) {
    cached = null;
    if (before && onChange) onChange(effective);
  }
  return effective;
}

/** Re-applies "auto" when TensorBoard or the OS switches theme. */
export function watchTheme(getMode, onChange) {
  const again = () => getMode() === "auto" && applyTheme("auto", onChange);
  window.matchMedia("(prefers-color-scheme: dark)").addEventListener("change", again);
  try {
    if (window.parent !== window && window.parent.document.body) {
      new MutationObserver(again).observe(window.parent.document.body, { attributes: true, attributeFilter: ["class"] });
    }
  } catch {
    /* cross-origin host */
  }
}
