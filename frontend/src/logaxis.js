// Log-axis helpers without a DOM or uPlot dependency, so that node's test
// runner can load them (charts.js imports uPlot).

/** Non-positive values cannot sit on a log axis: they become gaps. */
export function positiveOnly(arr) {
  return arr.map((v) => (v != null && v > 0 && Number.isFinite(v) ? v : null));
}

// The widest log range drawn: what finite positive doubles allow.
const LOG_MIN = 1e-300;
const LOG_MAX = 1e300;

/**
 * A defined log range for any input: finite, positive, min < max. Bounds
 * that are missing, zero, negative, NaN or infinite fall back to the data's
 * decade or to [1, 10].
 */
export function safeLogRange(min, max) {
  const ok = (v) => typeof v === "number" && Number.isFinite(v) && v > 0;
  let lo = ok(min) ? min : ok(max) ? max / 10 : 1;
  let hi = ok(max) ? max : lo * 10;
  lo = Math.min(Math.max(lo, LOG_MIN), LOG_MAX / 10);
  hi = Math.min(Math.max(hi, LOG_MIN * 10), LOG_MAX);
  if (!(hi > lo)) hi = Math.min(lo * 10, LOG_MAX);
  if (!(hi > lo)) lo = hi / 10;
  return [lo, hi];
}

/**
 * Tick values of a log axis, at most about `maxTicks`. uPlot's own log
 * splits step through its table of increments (1e-32…1e31) and never stop
 * when the axis starts below about 1e-25 or ends at Infinity: Array.push
 * grew until "RangeError: Invalid array length" after ~10 s of a frozen
 * page (a gradient whose smallest |x| is 1e-40). Here the count
 * is bounded whatever the range: whole decades, skipping some when there
 * are many, with 2 and 5 in between when the range spans few.
 */
export function logSplits(min, max, maxTicks = 6) {
  [min, max] = safeLogRange(min, max);
  const e0 = Math.floor(Math.log10(min));
  const e1 = Math.ceil(Math.log10(max));
  const decades = e1 - e0;
  const mults = decades <= 1 ? [1, 2, 3, 5, 7] : decades <= Math.max(1, maxTicks / 3) ? [1, 2, 5] : [1];
  const every = Math.max(1, Math.ceil(decades / Math.max(1, maxTicks)));
  const out = [];
  for (let e = Math.ceil(e0 / every) * every; e <= e1; e += every) {
    for (const m of mults) {
      const v = m * 10 ** e;
      if (v >= min * (1 - 1e-9) && v <= max * (1 + 1e-9)) out.push(v);
    }
  }
  // A range inside one decade with no 1-2-3-5-7 multiple: its two ends.
  return out.length ? out : [min, max];
}
