// Canvas maps of per-position rates: a heat map on a sequential colour scale
// and a two-colour alive/dead map. A map of 112×112 positions is one
// ImageData of that many pixels, scaled up without smoothing: a few ms
// whatever the size (one DOM node per cell would be 12,544 nodes).

// Viridis (matplotlib's default sequential scale): perceptually uniform, legible
// for colour-blind readers and on the light and the dark theme, and every step
// is saturated enough to tell a drawn cell from the page.
const VIRIDIS = ["#440154", "#472d7b", "#3b528b", "#2c728e", "#21918c", "#28ae80", "#5ec962", "#addc30", "#fde725"];

function rgb(hex) {
  const m = /^#?([0-9a-f]{2})([0-9a-f]{2})([0-9a-f]{2})$/i.exec(hex.trim());
  return m ? [1, 2, 3].map((i) => parseInt(m[i], 16)) : [128, 128, 128];
}

// 256 interpolated entries, r g b per entry.
const LUT = (() => {
  const stops = VIRIDIS.map(rgb);
  const lut = new Uint8ClampedArray(256 * 3);
  for (let i = 0; i < 256; i++) {
    const p = (i / 255) * (stops.length - 1);
    const k = Math.min(Math.floor(p), stops.length - 2);
    const f = p - k;
    for (let c = 0; c < 3; c++) lut[i * 3 + c] = Math.round(stops[k][c] + (stops[k + 1][c] - stops[k][c]) * f);
  }
  return lut;
})();

/** The CSS gradient of the colour scale, 0 % at the left (for a legend bar). */
export function scaleGradient() {
  return `linear-gradient(to right, ${VIRIDIS.join(", ")})`;
}

/**
 * Rows and columns a map of `positions` is drawn as: [H, W], or a 1-row
 * strip (`strip: true`) for a sequence's [L].
 */
export function gridOf(spatialShape, positions) {
  const dims = spatialShape && spatialShape.length ? spatialShape : [positions];
  if (dims.length === 1) return { rows: 1, cols: dims[0], strip: true };
  // Rank > 2 (3-D convolutions): the leading axes stacked into rows.
  const cols = dims[dims.length - 1];
  return { rows: dims.slice(0, -1).reduce((a, b) => a * b, 1), cols, strip: false };
}

/**
 * CSS pixel size of one cell: 2-D maps fit about `box` pixels a side, strips
 * `2 * box` wide and a fixed height; never under 1 px (wider maps are then
 * scaled down by the canvas' max-width).
 */
export function cellSize({ rows, cols, strip }, box = 280) {
  if (strip) return { w: Math.max(1, Math.min(28, Math.floor((2 * box) / cols))), h: 28 };
  const s = Math.max(1, Math.min(32, Math.floor(box / Math.max(rows, cols))));
  return { w: s, h: s };
}

/**
 * Draws `values` (row-major, one per cell; null = not logged) on `canvas`.
 * `colorOf(v)` returns [r, g, b] for a non-null value; `none` is the colour
 * of null cells.
 */
export function drawCells(canvas, values, grid, cell, colorOf, none) {
  const { rows, cols } = grid;
  const dpr = window.devicePixelRatio || 1;
  const cssW = cols * cell.w;
  const cssH = rows * cell.h;
  canvas.style.width = `${cssW}px`;
  canvas.style.aspectRatio = `${cssW} / ${cssH}`;
  const w = Math.max(1, Math.round(cssW * dpr));
  const hgt = Math.max(1, Math.round(cssH * dpr));
  if (canvas.width !== w) canvas.width = w;
  if (canvas.height !== hgt) canvas.height = hgt;
  const img = new ImageData(cols, rows);
  const d = img.data;
  const nan = rgb(none);
  for (let i = 0; i < rows * cols; i++) {
    const v = values[i];
    const c = v == null || Number.isNaN(v) ? nan : colorOf(v);
    d[i * 4] = c[0];
    d[i * 4 + 1] = c[1];
    d[i * 4 + 2] = c[2];
    d[i * 4 + 3] = 255;
  }
  // One pixel per cell, scaled up by drawImage without smoothing: sharp cells.
  const src = document.createElement("canvas");
  src.width = cols;
  src.height = rows;
  src.getContext("2d").putImageData(img, 0, 0);
  const ctx = canvas.getContext("2d");
  ctx.imageSmoothingEnabled = false;
  ctx.clearRect(0, 0, w, hgt);
  ctx.drawImage(src, 0, 0, w, hgt);
}

/** [r, g, b] of rate `v` (0..1, clamped) on the sequential scale. */
export function rateColor(v) {
  const i = Math.max(0, Math.min(255, Math.round(v * 255))) * 3;
  return [LUT[i], LUT[i + 1], LUT[i + 2]];
}

/** A colour function: `alive` for rates above 0, `dead` for exactly 0. */
export function aliveColor(alive, dead) {
  const a = rgb(alive);
  const z = rgb(dead);
  return (v) => (v > 0 ? a : z);
}

/** "#rrggbb" of `a` mixed with `b`, `f` of the way to `b`. */
export function mixHex(a, b, f) {
  const x = rgb(a);
  const y = rgb(b);
  return `#${x.map((v, i) => Math.round(v + (y[i] - v) * f).toString(16).padStart(2, "0")).join("")}`;
}

/** The (row, col) under a mouse event on a map canvas, or null outside it. */
export function cellAt(canvas, grid, event) {
  const r = canvas.getBoundingClientRect();
  if (!r.width || !r.height) return null;
  const col = Math.floor(((event.clientX - r.left) / r.width) * grid.cols);
  const row = Math.floor(((event.clientY - r.top) / r.height) * grid.rows);
  if (row < 0 || col < 0 || row >= grid.rows || col >= grid.cols) return null;
  return { row, col, index: row * grid.cols + col };
}
