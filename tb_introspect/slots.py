"""The packed-vector layout: the slots of every summary kind's vector, in order.

A point of each kind is one float vector (a VIEW_SUMMARY or PROBES point, a matrix of such
rows) whose slot names its metadata lists (``PluginData.fields``, ``docs/format.md``);
this module says which slots each kind has and in what order. The frontend spells the same
names by the rules of the generated schema (``frontend/src/slots.js``). Shared by the writer
and the plugin side, so it must never import TensorFlow.
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Sequence

import numpy as np

VIEWS = ("variable", "gradient", "output", "output_gradient")

#: Default percentile points: 0, 12.5, 25, ..., 100.
DEFAULT_QUANTILES: tuple[float, ...] = tuple(12.5 * i for i in range(9))

#: Slots every TENSOR_STATS vector starts with, in order.
BASE_FIELDS: tuple[str, ...] = (
    "epoch",
    "count",
    "finite_count",
    "nan_count",
    "posinf_count",
    "neginf_count",
    "zero_fraction",
    "sign_balance",
    "mean",
    "std",
    "rms",
    "l2",
    "min",
    "max",
    "activation_rate",
    "dead_rate",
    "spatial_dead_rate",
)

#: The slots counting a tensor's non-finite values (NaN, +Inf, -Inf).
NONFINITE_FIELDS: tuple[str, ...] = ("nan_count", "posinf_count", "neginf_count")

#: Activity slots: share of non-zero values, and of channels / positions that stay zero.
ACTIVITY_FIELDS: tuple[str, ...] = ("activation_rate", "dead_rate", "spatial_dead_rate")

#: Extra slots appended per view, after the quantile slots (the variable view then has
#: the ``ilr_q<p>`` slots, see ``view_extra_fields``).
VIEW_EXTRA_FIELDS: dict[str, tuple[str, ...]] = {
    # ||w_t - w_prev|| / ||w_t|| between two logged points.
    "variable": ("update_ratio",),
    # cosine between this gradient aggregate and the previous logged one.
    "gradient": ("cos_prev",),
    # How many of the window's steps the statistics (moments, extremes, percentiles) came
    # from, how many the activity counts (activation, dead rates) came from, and the
    # window's steps: activity is exact when ``activity_steps == steps`` (rectifier outputs)
    # and sampled from the statistics steps otherwise. NaN from writers that do not know.
    "output": ("stats_steps", "activity_steps", "steps"),
    "output_gradient": ("stats_steps", "steps"),
}

#: Slots counting a window's steps: the output views' extra slots, all step counts.
WINDOW_STEP_FIELDS: tuple[str, ...] = tuple(
    dict.fromkeys(VIEW_EXTRA_FIELDS["output"] + VIEW_EXTRA_FIELDS["output_gradient"]))

#: Prefix of the implicit-learning-rate percentile slots of the variable view:
#: percentiles over the elements of |w_t - w_prev| / |sum of the gradients in between|.
ILR_PREFIX = "ilr_"

METRIC_FIELDS: tuple[str, ...] = ("epoch", "value")
METRIC_EPOCH_FIELDS: tuple[str, ...] = (
    "epoch", "min", "p25", "p50", "p75", "max", "mean", "count",
)
#: The percentile slots of a METRIC_EPOCH vector (points 0, 25, 50, 75, 100 of
#: ``metric_epoch_band``), the band the Overview draws.
METRIC_EPOCH_BAND_FIELDS: tuple[str, ...] = METRIC_EPOCH_FIELDS[1:6]


#: Slots of a VIEW_SUMMARY row: ``row_key`` (``row_key(tag)`` of the row's tensor, so a
#: reader can tell a point whose rows are not those of the tag's first metadata, e.g. another
#: model written into the same run directory), then what the Overview draws (the RMS bands and
#: stack, the activity and non-finite rows). The variable view adds ``ilr_q50``, the median
#: implicit learning rate.
SUMMARY_FIELDS: tuple[str, ...] = (
    "row_key", "epoch", "rms", "activation_rate", "dead_rate", "spatial_dead_rate",
    "nan_count", "posinf_count", "neginf_count",
)
#: The summary matrix is stored as float32: 4 bytes a slot keep the run's bytes per logged
#: point within a tenth more than the per-tensor float64 vectors alone.
SUMMARY_DTYPE = np.float32


def row_key(tag: str) -> float:
    """The ``row_key`` slot of the row of ``tag``: 24 bits of its CRC-32 (exact in float32)."""
    return float(zlib.crc32(tag.encode()) & 0xFFFFFF)


def summary_fields(view: str) -> tuple[str, ...]:
    """The slots of one row of ``view``'s VIEW_SUMMARY matrix."""
    check_view(view)
    return SUMMARY_FIELDS + ((ILR_PREFIX + quantile_field(50.0),) if view == "variable" else ())


def median_weights(quantiles: Sequence[float]) -> tuple[float, float, float] | None:
    """How the median follows from percentile points ``quantiles``: ``(lo, hi, w)`` with
    median = ``(1 - w) * p_lo + w * p_hi`` (numpy's linear interpolation between the points
    around 50); ``None`` without points."""
    qs = sorted(float(q) for q in quantiles)
    if not qs:
        return None
    below = [q for q in qs if q <= 50.0]
    above = [q for q in qs if q >= 50.0]
    lo = below[-1] if below else above[0]
    hi = above[0] if above else below[-1]
    return lo, hi, 0.0 if hi == lo else (50.0 - lo) / (hi - lo)


#: Slots of a PROBES row: ``row_key`` (``row_key(name)`` of the row's module), ``epoch``, then
#: the probes (``PROBE_VALUE_FIELDS``), NaN where a probe does not apply to the row:
#: ``abs_median`` (a layer output's median |a|, from a sample of at most
#: ``PROBE_SAMPLE_SIZE`` values of each statistics step's batch, averaged over the window's
#: statistics steps), ``kurtosis`` (a layer output's m4 / m2², 3 for a Gaussian, per
#: statistics step, averaged), ``attn_logit_max`` (an attention layer's largest
#: |pre-softmax logit|, max over the window), ``logit_max`` (the output head's largest logit,
#: max over the window) and ``logit_lse`` (the head's mean logsumexp over rows, averaged).
PROBE_FIELDS: tuple[str, ...] = (
    "row_key", "epoch", "abs_median", "kurtosis", "attn_logit_max", "logit_max", "logit_lse",
)
#: The probes a front-end computes, per row (the pipeline fills ``row_key`` and ``epoch``).
PROBE_VALUE_FIELDS: tuple[str, ...] = PROBE_FIELDS[2:]
#: At most this many values of a batch give ``abs_median``.
PROBE_SAMPLE_SIZE = 4096

def quantile_field(q: float, log: bool = False) -> str:
    """Name of the slot holding percentile ``q``: ``q12.5`` or ``logq12.5``."""
    text = f"{float(q):g}"
    return ("logq" if log else "q") + text


def tensor_stats_fields(
    view: str, quantiles: Sequence[float] = DEFAULT_QUANTILES
) -> tuple[str, ...]:
    """The ordered slot names of a TENSOR_STATS vector for ``view``."""
    return _tensor_stats_fields(view, tuple(float(q) for q in quantiles))


# Cached: every tensor of a logged point asks for its layout, and building the names is
# most of a small tensor's numpy statistics otherwise (about 80 of 440 us).
@functools.lru_cache(maxsize=64)
def _tensor_stats_fields(view: str, quantiles: tuple[float, ...]) -> tuple[str, ...]:
    check_view(view)
    return (
        BASE_FIELDS
        + tuple(quantile_field(q) for q in quantiles)
        + tuple(quantile_field(q, log=True) for q in quantiles)
        + view_extra_fields(view, quantiles)
    )


def view_extra_fields(
    view: str, quantiles: Sequence[float] = DEFAULT_QUANTILES
) -> tuple[str, ...]:
    """The view-specific slots that end a TENSOR_STATS vector of ``view``."""
    check_view(view)
    extra = VIEW_EXTRA_FIELDS[view]
    if view == "variable":
        extra += tuple(ILR_PREFIX + quantile_field(q) for q in quantiles)
    return extra


def activity_fields(channels: int, positions: int) -> tuple[str, ...]:
    """Slots of an ACTIVITY_MAP vector: ``epoch``, ``samples``, then the activation rate of
    each channel (``c0`` …) and of each spatial position (``s0`` …, row-major)."""
    return ("epoch", "samples", *(f"c{i}" for i in range(channels)),
            *(f"s{i}" for i in range(positions)))


def upgrade_values(version: int, fields: Sequence[str], values: np.ndarray) -> np.ndarray:
    """Points ``[n, fields]`` of an older format version, read as the current version.

    Version 1 wrote ``sign_balance = (n_pos - n_neg) / finite_count``; with ``z`` the
    zero fraction that is ``(1 - z)`` times today's balance over the non-zero values
    (undefined, NaN, when every value is zero). Returns ``values`` itself when nothing
    changes.
    """
    if version >= 2:
        return values
    try:
        sb, zf = fields.index("sign_balance"), fields.index("zero_fraction")
    except ValueError:
        return values
    out = values.copy()
    nonzero = 1.0 - out[:, zf]
    with np.errstate(divide="ignore", invalid="ignore"):
        balance = np.where(nonzero > 0, out[:, sb] / nonzero, np.nan)
    out[:, sb] = np.clip(balance, -1.0, 1.0)  # the division can round past ±1
    return out


def check_view(view: str) -> None:
    """A ``ValueError`` for a view the format does not know."""
    if view not in VIEWS:
        raise ValueError(f"unknown view {view!r}; expected one of {', '.join(VIEWS)}")
