// Number formatting for axes and readouts.

/** Readout value: 6 significant digits, exponent form for very small/large. */
export function fmt(v, digits = 6) {
  if (v == null) return "—";
  if (Number.isNaN(v)) return "NaN";
  if (!Number.isFinite(v)) return v > 0 ? "+Inf" : "−Inf";
  if (v === 0) return "0";
  const a = Math.abs(v);
  if (a >= 1e-3 && a < 1e6) return trimZeros(v.toPrecision(digits));
  return expForm(v, digits);
}

function trimZeros(s) {
  if (!s.includes(".") || s.includes("e")) return s;
  return s.replace(/\.?0+$/, "");
}

function expForm(v, digits) {
  const [m, e] = v.toExponential(digits - 1).split("e");
  return `${trimZeros(m)}e${e.replace("+", "")}`;
}

/** Percent with one decimal. */
export function pct(v, digits = 1) {
  if (v == null || !Number.isFinite(v)) return "—";
  return `${(v * 100).toFixed(digits)}%`;
}

/** Compact axis tick: 1e-4, 0.01, 250, 1.5k. */
export function tick(v) {
  if (v == null || !Number.isFinite(v)) return "";
  if (v === 0) return "0";
  const a = Math.abs(v);
  if (a >= 1e-2 && a < 1e4) return String(+v.toPrecision(3));
  if (a >= 1e4 && a < 1e6) return `${+(v / 1e3).toPrecision(3)}k`;
  const e = Math.floor(Math.log10(a) + 1e-9);
  const m = v / 10 ** e;
  return Math.abs(Math.abs(m) - 1) < 1e-6 ? `${m < 0 ? "−" : ""}1e${e}` : `${+m.toPrecision(2)}e${e}`;
}

export function isFiniteNum(v) {
  return typeof v === "number" && Number.isFinite(v);
}
