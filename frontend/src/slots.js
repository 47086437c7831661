// Slot and tag names built by the rules of the generated schema (./schema.js,
// from tb_introspect/metadata.py and slots.py): the naming lives there, the spelling here.

import { ILR_PREFIX, QUANTILE_FIELD, TAG_PREFIX, VIEWS } from "./schema.js";

/**
 * `x` as Python's f"{x:g}" writes it: `digits` significant digits rounded half
 * to even, an exponent ("1e-05") below 1e-4 and from 10^digits, trailing zeros dropped.
 */
export function formatG(x, digits = QUANTILE_FIELD.significant_digits) {
  if (Number.isNaN(x)) return "nan";
  if (!Number.isFinite(x)) return x > 0 ? "inf" : "-inf";
  if (x === 0) return Object.is(x, -0) ? "-0" : "0";
  const sign = x < 0 ? "-" : "";
  // 101 significant digits: the double's exact decimal value in practice, so that a tie
  // rounds to even as Python does (toPrecision rounds it up).
  const [mant, exp] = Math.abs(x).toExponential(100).split("e");
  const all = mant.replace(".", "");
  let head = all.slice(0, digits);
  const rest = all.slice(digits);
  let e = Number(exp);
  const up = rest[0] > "5" || (rest[0] === "5" && (/[1-9]/.test(rest.slice(1)) || Number(head.at(-1)) % 2 === 1));
  if (up) {
    head = (BigInt(head) + 1n).toString();
    if (head.length > digits) {
      head = head.slice(0, digits);
      e += 1;
    }
  }
  const trim = (s) => (s.includes(".") ? s.replace(/0+$/, "").replace(/\.$/, "") : s);
  if (e >= -4 && e < digits) {
    const text = e >= 0 ? `${head.slice(0, e + 1)}.${head.slice(e + 1)}` : `0.${"0".repeat(-e - 1)}${head}`;
    return sign + trim(text);
  }
  const m = trim(`${head[0]}.${head.slice(1)}`);
  return `${sign}${m}e${e < 0 ? "-" : "+"}${String(Math.abs(e)).padStart(2, "0")}`;
}

/** The slot of percentile `q` (slots.quantile_field): q12.5, or with `log` logq12.5. */
export function quantileField(q, log) {
  return `${log ? QUANTILE_FIELD.log_prefix : QUANTILE_FIELD.prefix}${formatG(q)}`;
}

/** The implicit-learning-rate slot of percentile `q`: ILR_PREFIX + its quantile slot. */
export function ilrField(q) {
  return ILR_PREFIX + quantileField(q, false);
}

/** The view of a statistics tag (TAG_PREFIX + "<view>/<name>"), or null for any other tag. */
export function viewOfTag(tag) {
  if (!tag || !tag.startsWith(TAG_PREFIX)) return null;
  const view = tag.slice(TAG_PREFIX.length).split("/", 1)[0];
  return VIEWS.includes(view) ? view : null;
}

/** The tensor name of a tag TAG_PREFIX + "<kind>/<name>" (the tag itself when it is no such tag). */
export function tensorNameOfTag(tag) {
  if (!tag.startsWith(TAG_PREFIX)) return tag;
  const rest = tag.slice(TAG_PREFIX.length);
  const kind = /^[a-z_]+\//.exec(rest);
  return kind ? rest.slice(kind[0].length) : tag;
}
