"""Plugin name, format version, tags and the packed-vector layout of summaries.

This module is shared by the writer side and the plugin side, so it must
never import TensorFlow. The format is documented in ``docs/format.md``; the tab's
texts and the ``schema()`` the frontend imports are in :mod:`tb_introspect.schema`.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import zlib
from collections.abc import Sequence

import numpy as np
from tensorboard.compat.proto import summary_pb2

from tb_introspect.proto import plugin_data_pb2

logger = logging.getLogger(__name__)

PLUGIN_NAME = "introspect"
#: Version 2: ``sign_balance`` is taken over the non-zero values (version 1 divided by every
#: finite value, zeros included; readers convert it with ``upgrade_values``), the variable
#: view has the implicit-learning-rate slots, and the ACTIVITY_MAP kind exists.
#: Version 3: the VIEW_SUMMARY kind, one tag per view holding the first screen's slots of
#: every tensor of the view (``view_summary``); the per-tensor tags are unchanged.
#: Version 4: the PROBES kind, one tag holding per-module probes of a transformer's failure
#: modes (``probes_tag``); earlier versions simply have none.
PROTO_VERSION = 4

VIEWS = ("variable", "gradient", "output", "output_gradient")
#: The findings' severities, most severe first.
SEVERITIES = ("critical", "warning", "info")
#: A point's cadence (``PluginData.cadence``): ``step``, the statistics of sampled steps
#: (``every=N``); ``epoch``, aggregated over the epoch's steps; ``window``, aggregated the
#: same way over the steps since the previous point (``window=N``: every N steps and at
#: each epoch's end; the output views' ``steps`` slot holds the window's length).
CADENCES = ("step", "epoch", "window")
#: The cadences whose points aggregate every step of their window.
AGGREGATED_CADENCES = ("epoch", "window")

TENSOR_STATS = plugin_data_pb2.PluginData.TENSOR_STATS
METRIC = plugin_data_pb2.PluginData.METRIC
METRIC_EPOCH = plugin_data_pb2.PluginData.METRIC_EPOCH
ACTIVITY_MAP = plugin_data_pb2.PluginData.ACTIVITY_MAP
VIEW_SUMMARY = plugin_data_pb2.PluginData.VIEW_SUMMARY
PROBES = plugin_data_pb2.PluginData.PROBES

TAG_PREFIX = PLUGIN_NAME + "/"

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
    _check_view(view)
    return SUMMARY_FIELDS + ((ILR_PREFIX + quantile_field(50.0),) if view == "variable" else ())


def summary_tag(view: str) -> str:
    """Tag of the VIEW_SUMMARY of ``view``."""
    _check_view(view)
    return f"{TAG_PREFIX}summary/{view}"


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


def create_view_summary_metadata(
    *, view: str, rows: Sequence[str], cadence: str = "step"
) -> summary_pb2.SummaryMetadata:
    """SummaryMetadata for the VIEW_SUMMARY of ``view``; ``rows``: the TENSOR_STATS tag of
    each row, in order (fixed for the run: a row without a value at a point holds NaN)."""
    check_cadence(cadence)
    data = plugin_data_pb2.PluginData(
        version=PROTO_VERSION,
        kind=VIEW_SUMMARY,
        view=view,
        name=view,
        cadence=cadence,
        fields=summary_fields(view),
        quantiles=[50.0] if view == "variable" else [],
        rows=list(rows),
    )
    return _summary_metadata(data, f"{view} summary of {len(rows)} tensors")


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
#: Reference thresholds the tab draws and the findings use: an attention logit past
#: Megatron-LM's ``--qk-clip-threshold`` (100), the kurtosis of a Gaussian (3, a layer
#: output at initialisation), a massive activation (|a| > 100 and > 1000 times the layer
#: output's median |a|).
PROBE_REFERENCES: dict[str, float] = {
    "attn_logit_max": 100.0, "kurtosis": 3.0, "massive_abs": 100.0, "massive_ratio": 1000.0,
}


def probes_tag() -> str:
    """Tag of the PROBES summary (one per logged point)."""
    return f"{TAG_PREFIX}probes"


def create_probes_metadata(*, rows: Sequence[str],
                           cadence: str = "step") -> summary_pb2.SummaryMetadata:
    """SummaryMetadata for the PROBES summary; ``rows``: the module of each row, in order
    (fixed for the run)."""
    check_cadence(cadence)
    data = plugin_data_pb2.PluginData(
        version=PROTO_VERSION, kind=PROBES, name="probes", cadence=cadence,
        fields=PROBE_FIELDS, rows=list(rows),
    )
    return _summary_metadata(data, f"probes of {len(rows)} modules")


def metric_epoch_band(values, epoch: float = 0) -> np.ndarray:
    """The METRIC_EPOCH vector ``[epoch, min, p25, p50, p75, max, mean, count]`` of ``values``.

    Over the finite values only, percentiles with numpy's linear interpolation (exact: the
    values of one epoch are few); NaN with ``count`` 0 when none is finite. The writers and
    the overview (a band computed from per-step values) all use this one definition.
    """
    v = np.asarray(values, dtype=np.float64).reshape(-1)
    v = v[np.isfinite(v)]
    band = [*np.percentile(v, [0, 25, 50, 75, 100]), v.mean()] if v.size else [np.nan] * 6
    return np.array([epoch, *band, v.size], dtype=np.float64)


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
    _check_view(view)
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
    _check_view(view)
    extra = VIEW_EXTRA_FIELDS[view]
    if view == "variable":
        extra += tuple(ILR_PREFIX + quantile_field(q) for q in quantiles)
    return extra


def activity_fields(channels: int, positions: int) -> tuple[str, ...]:
    """Slots of an ACTIVITY_MAP vector: ``epoch``, ``samples``, then the activation rate of
    each channel (``c0`` …) and of each spatial position (``s0`` …, row-major)."""
    return ("epoch", "samples", *(f"c{i}" for i in range(channels)),
            *(f"s{i}" for i in range(positions)))


def activity_tag(name: str) -> str:
    """Tag of the per-channel and per-position activation rates of layer output ``name``."""
    return f"{TAG_PREFIX}activity/{name}"


def create_activity_metadata(
    *,
    name: str,
    channels: int,
    positions: int,
    layer: str = "",
    depth: int = 0,
    shape: Sequence[int | None] = (),
) -> summary_pb2.SummaryMetadata:
    """SummaryMetadata for the per-epoch activity map of one layer output."""
    data = plugin_data_pb2.PluginData(
        version=PROTO_VERSION,
        kind=ACTIVITY_MAP,
        view="output",
        layer=layer or name,
        depth=int(depth),
        name=name,
        shape=_shape_field(shape),
        cadence="epoch",
        fields=activity_fields(channels, positions),
    )
    return _summary_metadata(data, f"activity map of {name}")


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


def stats_tag(view: str, name: str) -> str:
    """Tag of the summary holding ``view`` statistics of tensor ``name``."""
    _check_view(view)
    return f"{TAG_PREFIX}{view}/{name}"


def metric_tag(name: str, per_epoch: bool = False) -> str:
    """Tag of a per-step metric, or of its per-epoch band."""
    return f"{TAG_PREFIX}{'metric_epoch' if per_epoch else 'metric'}/{name}"


def check_cadence(cadence: str) -> None:
    """A ``ValueError`` for a cadence the format does not know."""
    if cadence not in CADENCES:
        raise ValueError(f"unknown cadence {cadence!r}; expected one of {', '.join(CADENCES)}")


def _check_view(view: str) -> None:
    if view not in VIEWS:
        raise ValueError(f"unknown view {view!r}; expected one of {', '.join(VIEWS)}")


def create_tensor_stats_metadata(
    *,
    view: str,
    name: str,
    layer: str = "",
    depth: int = 0,
    shape: Sequence[int | None] = (),
    dtype: str = "float32",
    cadence: str = "step",
    quantiles: Sequence[float] = DEFAULT_QUANTILES,
) -> summary_pb2.SummaryMetadata:
    """SummaryMetadata for the statistics of one view of one tensor."""
    check_cadence(cadence)
    data = plugin_data_pb2.PluginData(
        version=PROTO_VERSION,
        kind=TENSOR_STATS,
        view=view,
        layer=layer or name,
        depth=int(depth),
        name=name,
        shape=_shape_field(shape),
        dtype=str(dtype),
        cadence=cadence,
        fields=tensor_stats_fields(view, quantiles),
        quantiles=[float(q) for q in quantiles],
    )
    return _summary_metadata(data, f"{view} statistics of {name}")


def create_metric_metadata(
    name: str, per_epoch: bool = False, loss: str = ""
) -> summary_pb2.SummaryMetadata:
    """SummaryMetadata for a per-step metric or its per-epoch band; ``loss``: the training
    loss's description (``loss_json``), for the ``loss`` metric."""
    data = plugin_data_pb2.PluginData(
        version=PROTO_VERSION,
        kind=METRIC_EPOCH if per_epoch else METRIC,
        name=name,
        cadence="epoch" if per_epoch else "step",
        fields=METRIC_EPOCH_FIELDS if per_epoch else METRIC_FIELDS,
        loss=loss,
    )
    return _summary_metadata(data, f"metric {name}")


#: What a loss description says (``PluginData.loss``, docs/format.md "The loss").
LOSS_TASKS = ("classification", "regression")


def loss_json(task: str | None, *, from_logits: bool | None = None,
              label_smoothing: float = 0.0, name: str = "") -> str:
    """The description of a training loss as the ``loss`` field holds it.

    ``task``: "classification" (a cross-entropy), "regression" or None (not known);
    ``from_logits``: whether the loss applies the softmax/sigmoid itself (None: not known);
    ``label_smoothing``: the share of each target spread over the other classes.

    Example:
        >>> parse_loss(loss_json("classification", from_logits=True))["from_logits"]
        True
    """
    if task is not None and task not in LOSS_TASKS:
        raise ValueError(f"loss task must be one of {LOSS_TASKS} or None, got {task!r}")
    if from_logits is not None and not isinstance(from_logits, bool):
        raise ValueError(f"from_logits must be True, False or None, got {from_logits!r}")
    ls = float(label_smoothing)
    if not (math.isfinite(ls) and 0 <= ls < 1):
        raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing!r}")
    return json.dumps({"task": task, "from_logits": from_logits, "label_smoothing": ls,
                       "name": str(name)})


def parse_loss(text: str) -> dict | None:
    """A ``loss`` field read back: the dict of ``loss_json``, or None (empty or unreadable)."""
    if not text:
        return None
    try:
        d = json.loads(text)
    except ValueError:
        return None
    if not isinstance(d, dict):
        return None
    ls = d.get("label_smoothing")
    return {"task": d.get("task") if d.get("task") in LOSS_TASKS else None,
            "from_logits": d.get("from_logits") if isinstance(d.get("from_logits"), bool)
            else None,
            "label_smoothing": float(ls) if isinstance(ls, (int, float)) else 0.0,
            "name": str(d.get("name", "")),
            # what the framework knows of the run (torch.loss.describe_run)
            "untrained": [n for n in d["untrained"] if isinstance(n, str)]
            if isinstance(d.get("untrained"), list) else [],
            "output_module": str(d.get("output_module") or "")}


def _shape_field(shape: Sequence[int | None]) -> list[int]:
    """``PluginData.shape``: the static shape with -1 for unknown dimensions."""
    return [-1 if d is None else int(d) for d in shape]


def _summary_metadata(
    data: plugin_data_pb2.PluginData, description: str
) -> summary_pb2.SummaryMetadata:
    return summary_pb2.SummaryMetadata(
        summary_description=description,
        plugin_data=summary_pb2.SummaryMetadata.PluginData(
            plugin_name=PLUGIN_NAME, content=data.SerializeToString()
        ),
        # Without DATA_CLASS_TENSOR, TensorBoard's loaders drop the data.
        data_class=summary_pb2.DATA_CLASS_TENSOR,
    )


def parse_plugin_data(content: bytes) -> plugin_data_pb2.PluginData:
    """Parse ``SummaryMetadata.plugin_data.content``.

    Raises ``ValueError`` on bytes that are not a PluginData message. Data
    written by a newer format version is parsed on a best-effort basis and
    logs a warning (once per version) instead of failing.
    """
    data = plugin_data_pb2.PluginData()
    try:
        data.ParseFromString(content)
    except Exception as e:  # protobuf raises DecodeError, a private subclass
        raise ValueError(f"malformed tb-introspect plugin data: {e}") from e
    if data.version > PROTO_VERSION and data.version not in _warned_versions:
        _warned_versions.add(data.version)
        logger.warning(
            "tb-introspect data has format version %d, newer than this reader's %d;"
            " reading it on a best-effort basis (upgrade tb-introspect)",
            data.version,
            PROTO_VERSION,
        )
    return data


_warned_versions: set[int] = set()
