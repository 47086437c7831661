"""Plugin name, format version, tags and the summary metadata of each kind.

This module is shared by the writer side and the plugin side, so it must
never import TensorFlow. The format is documented in ``docs/format.md``; the slots of each
kind's vector are in :mod:`tb_introspect.slots`, the tab's texts and the ``schema()`` the
frontend imports in :mod:`tb_introspect.schema`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from tensorboard.compat.proto import summary_pb2

from tb_introspect import slots
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


def summary_tag(view: str) -> str:
    """Tag of the VIEW_SUMMARY of ``view``."""
    slots.check_view(view)
    return f"{TAG_PREFIX}summary/{view}"


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
        fields=slots.summary_fields(view),
        quantiles=[50.0] if view == "variable" else [],
        rows=list(rows),
    )
    return _summary_metadata(data, f"{view} summary of {len(rows)} tensors")




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
        fields=slots.PROBE_FIELDS, rows=list(rows),
    )
    return _summary_metadata(data, f"probes of {len(rows)} modules")


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
        fields=slots.activity_fields(channels, positions),
    )
    return _summary_metadata(data, f"activity map of {name}")


def stats_tag(view: str, name: str) -> str:
    """Tag of the summary holding ``view`` statistics of tensor ``name``."""
    slots.check_view(view)
    return f"{TAG_PREFIX}{view}/{name}"


def metric_tag(name: str, per_epoch: bool = False) -> str:
    """Tag of a per-step metric, or of its per-epoch band."""
    return f"{TAG_PREFIX}{'metric_epoch' if per_epoch else 'metric'}/{name}"


def check_cadence(cadence: str) -> None:
    """A ``ValueError`` for a cadence the format does not know."""
    if cadence not in CADENCES:
        raise ValueError(f"unknown cadence {cadence!r}; expected one of {', '.join(CADENCES)}")


def create_tensor_stats_metadata(
    *,
    view: str,
    name: str,
    layer: str = "",
    depth: int = 0,
    shape: Sequence[int | None] = (),
    dtype: str = "float32",
    cadence: str = "step",
    quantiles: Sequence[float] = slots.DEFAULT_QUANTILES,
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
        fields=slots.tensor_stats_fields(view, quantiles),
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
        fields=slots.METRIC_EPOCH_FIELDS if per_epoch else slots.METRIC_FIELDS,
        loss=loss,
    )
    return _summary_metadata(data, f"metric {name}")


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
