"""Numpy-only builders of tb-introspect ``Summary`` protos (no TensorFlow).

These let any framework write the format: pass the protos to TensorBoard's
``EventFileWriter`` (see ``tb_introspect.writer``) or to PyTorch's
``SummaryWriter.file_writer.add_summary``. Each ``*_pb`` builder is its ``*_value``
builder encoded: a :class:`Value` is one summary value as the writer holds it (tag, array,
metadata), and :func:`encode` makes the proto. The pipeline keeps values until it writes
them, so the findings judged during training read the arrays it wrote, not their protos.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
from tensorboard.compat.proto import summary_pb2, types_pb2
from tensorboard.util import tensor_util

from tb_introspect import metadata, slots


def _float32_held(out: np.ndarray) -> np.ndarray:
    """``out`` as the summaries' float32, a finite value past its range held at its largest
    (still "too big", not non-finite)."""
    big = float(np.finfo(slots.SUMMARY_DTYPE).max)
    return np.where(np.isfinite(out), np.clip(out, -big, big), out).astype(slots.SUMMARY_DTYPE)


def view_summary(view: str, rows: Sequence[str], vectors: np.ndarray,
                 quantiles: Sequence[float] = slots.DEFAULT_QUANTILES) -> np.ndarray:
    """The VIEW_SUMMARY matrix ``[rows, summary_fields(view)]`` (float32) of the packed
    TENSOR_STATS vectors ``[rows, slots.tensor_stats_fields(view, quantiles)]`` of one logged
    point, ``rows`` their tags. A finite slot past float32's range is held at its largest
    value (still "too big", not non-finite). Every writer builds its summary with this one
    function."""
    fields = slots.tensor_stats_fields(view, quantiles)
    v = np.asarray(vectors, dtype=np.float64).reshape(-1, len(fields))
    if len(rows) != len(v):
        raise ValueError(f"{view} summary: {len(rows)} rows, {len(v)} vectors")
    index = {f: i for i, f in enumerate(fields)}
    cols = [np.array([slots.row_key(t) for t in rows], dtype=np.float64)]
    cols += [v[:, index[f]] for f in slots.SUMMARY_FIELDS[1:]]
    if view == "variable":
        lo, hi, w = slots.median_weights(quantiles)
        a, b = (v[:, index[slots.ILR_PREFIX + slots.quantile_field(q)]] for q in (lo, hi))
        cols.append(a if w == 0.0 else (1.0 - w) * a + w * b)
    out = np.stack(cols, axis=1)
    return _float32_held(out)


def probes_matrix(rows: Sequence[str], values: dict, epoch: float = 0) -> np.ndarray:
    """The PROBES matrix ``[rows, slots.PROBE_FIELDS]`` (float32) of one point: ``values[name]``
    holds row ``name``'s ``PROBE_VALUE_FIELDS`` (a row without one is NaN but for its
    ``row_key``; a name that is not a row is left out). A finite value past float32's range
    is held at its largest value, as in ``view_summary``."""
    width = len(slots.PROBE_VALUE_FIELDS)
    out = np.full((len(rows), len(slots.PROBE_FIELDS)), np.nan)
    for i, name in enumerate(rows):
        out[i, 0] = slots.row_key(name)
        v = values.get(name)
        if v is None:
            continue
        v = np.asarray(v, dtype=np.float64).reshape(-1)
        if v.size != width:
            raise ValueError(f"probes of {name!r}: {v.size} values, expected {width}"
                             f" ({', '.join(slots.PROBE_VALUE_FIELDS)})")
        out[i, 1] = epoch
        out[i, 2:] = v
    return _float32_held(out)


class Value(NamedTuple):
    """One summary value before it is encoded: its ``tag``, the ``array`` its tensor holds
    (in the dtype written: float64 vectors, float32 matrices) and its ``metadata`` (None
    after a tag's first value in an event file: TensorBoard keeps a tag's first)."""

    tag: str
    array: np.ndarray
    metadata: summary_pb2.SummaryMetadata | None = None


def encode(values: Iterable[Value]) -> summary_pb2.Summary:
    """One ``Summary`` proto holding ``values``, in order.

    Example:
        >>> encode([metric_value("loss", 0.5)]).value[0].tag
        'introspect/metric/loss'
    """
    summary = summary_pb2.Summary()
    for v in values:
        value = summary.value.add(tag=v.tag)
        _set_tensor(value.tensor, v.array)
        if v.metadata is not None:
            value.metadata.CopyFrom(v.metadata)
    return summary


def _vector_value(tag: str, meta: summary_pb2.SummaryMetadata, vector) -> Value:
    vec = np.asarray(vector, dtype=np.float64).reshape(-1)
    expected = len(metadata.parse_plugin_data(meta.plugin_data.content).fields)
    if vec.size != expected:
        raise ValueError(f"{tag}: packed vector has {vec.size} slots, layout has {expected}")
    return Value(tag, vec, meta)


def _set_tensor(tensor, array: np.ndarray) -> None:
    """Fill the ``TensorProto`` ``tensor`` with ``array`` as
    ``tensor_util.make_tensor_proto`` would (the same bytes); a float64 vector three times
    faster: a point writes one per tensor."""
    if array.ndim != 1 or array.dtype != np.float64 or array.size <= 1:
        tensor.CopyFrom(tensor_util.make_tensor_proto(array))  # (and the double_val form)
        return
    tensor.dtype = types_pb2.DT_DOUBLE
    tensor.tensor_shape.dim.add(size=array.size)
    tensor.tensor_content = array.tobytes()


def tensor_stats_value(
    stats_vector: Sequence[float] | np.ndarray,
    *,
    view: str,
    name: str,
    layer: str = "",
    depth: int = 0,
    shape: Sequence[int | None] = (),
    dtype: str = "float32",
    cadence: str = "step",
    quantiles: Sequence[float] = slots.DEFAULT_QUANTILES,
    with_metadata: bool = True,
) -> Value:
    """An already packed statistics vector (see docs/format.md) as a summary value.

    Write the metadata (``with_metadata``) with the tag's first point in an event file
    only: TensorBoard keeps a tag's first metadata. ``ViewSummaries.tensor_stats`` does
    this bookkeeping for a writer."""
    tag = metadata.stats_tag(view, name)
    metadata.check_cadence(cadence)
    # A copy: the value is held until written and judged, its caller's array may change.
    vec = np.array(stats_vector, dtype=np.float64).reshape(-1)
    expected = len(slots.tensor_stats_fields(view, quantiles))
    if vec.size != expected:
        raise ValueError(f"{tag}: packed vector has {vec.size} slots, layout has {expected}")
    meta = metadata.create_tensor_stats_metadata(
        view=view, name=name, layer=layer, depth=depth, shape=shape,
        dtype=dtype, cadence=cadence, quantiles=quantiles,
    ) if with_metadata else None
    return Value(tag, vec, meta)


def tensor_stats_pb(stats_vector: Sequence[float] | np.ndarray,
                    **described: Any) -> summary_pb2.Summary:
    """``tensor_stats_value`` (the same keywords) as a ``Summary`` proto."""
    return encode([tensor_stats_value(stats_vector, **described)])


def metric_pb(name: str, value: float, epoch: int = 0, loss: str = "") -> summary_pb2.Summary:
    """``metric_value`` as a ``Summary`` proto."""
    return encode([metric_value(name, value, epoch, loss)])


def metric_value(name: str, value: float, epoch: int = 0, loss: str = "") -> Value:
    """One per-step value of a loss or metric (``loss``: the training loss's description,
    ``loss_field.loss_json``)."""
    return _vector_value(
        metadata.metric_tag(name), metadata.create_metric_metadata(name, loss=loss),
        [epoch, value],
    )


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


def metric_epoch_pb(name: str, values: Sequence[float], epoch: int,
                    loss: str = "") -> summary_pb2.Summary:
    """``metric_epoch_value`` as a ``Summary`` proto."""
    return encode([metric_epoch_value(name, values, epoch, loss)])


def metric_epoch_value(name: str, values: Sequence[float], epoch: int,
                       loss: str = "") -> Value:
    """The per-epoch band (``metric_epoch_band``) of a metric's per-step ``values``."""
    return _vector_value(
        metadata.metric_tag(name, per_epoch=True),
        metadata.create_metric_metadata(name, per_epoch=True, loss=loss),
        metric_epoch_band(values, epoch),
    )


def activity_value(
    channel_rates: Sequence[float] | np.ndarray,
    spatial_rates: Sequence[float] | np.ndarray = (),
    *,
    name: str,
    samples: float,
    epoch: int = 0,
    layer: str = "",
    depth: int = 0,
    shape: Sequence[int | None] = (),
    with_metadata: bool = True,
) -> Value:
    """One epoch's activation rate of each channel and of each spatial position (flattened
    row-major) of layer output ``name``, over ``samples`` samples. The metadata (its slot
    names: one per channel and position) with the tag's first map in an event file only
    (``with_metadata``; ``ViewSummaries.activity`` does this bookkeeping)."""
    c = np.asarray(channel_rates, dtype=np.float64).reshape(-1)
    p = np.asarray(spatial_rates, dtype=np.float64).reshape(-1)
    meta = metadata.create_activity_metadata(
        name=name, channels=c.size, positions=p.size, layer=layer, depth=depth, shape=shape
    ) if with_metadata else None
    return Value(metadata.activity_tag(name), np.concatenate([[epoch, samples], c, p]), meta)


def activity_pb(channel_rates: Sequence[float] | np.ndarray,
                spatial_rates: Sequence[float] | np.ndarray = (),
                **described: Any) -> summary_pb2.Summary:
    """``activity_value`` (the same keywords) as a ``Summary`` proto."""
    return encode([activity_value(channel_rates, spatial_rates, **described)])


def fill_slots(
    vector, view: str, quantiles: Sequence[float] = slots.DEFAULT_QUANTILES, **values: float
) -> np.ndarray:
    """A copy of a packed vector, or of a ``[rows, slots]`` stack of them, with the named
    slots (e.g. ``epoch=3``) set (a value per row, or one for all)."""
    fields = slots.tensor_stats_fields(view, quantiles)
    vec = np.array(vector, dtype=np.float64)
    if vec.ndim != 2:
        vec = vec.reshape(-1)
    for key, value in values.items():
        if key not in fields:
            raise ValueError(f"{key!r} is not a slot of {view} statistics; slots: {fields}")
        vec[..., fields.index(key)] = value
    return vec


def vector_of(summary: summary_pb2.Summary) -> np.ndarray:
    """The packed float64 vector of a one-value tb-introspect Summary."""
    return tensor_util.make_ndarray(summary.value[0].tensor).astype(np.float64)


def view_summary_value(
    view: str,
    rows: Sequence[str],
    vectors,
    *,
    quantiles: Sequence[float] = slots.DEFAULT_QUANTILES,
    cadence: str = "step",
    with_metadata: bool = True,
) -> Value:
    """One logged point's VIEW_SUMMARY of ``view`` (format version 3).

    ``rows``: the TENSOR_STATS tags (``metadata.stats_tag``) the summary covers, in order;
    keep them the same at every point of a run. ``vectors``: ``[len(rows), slots]``, each
    row the packed vector that tag holds at this point (all NaN where it has none). Write
    the metadata (``with_metadata``) with the tag's first point only: TensorBoard keeps a
    tag's first metadata, so later points need none. ``ViewSummaries`` does this
    bookkeeping for a writer.

    Example:
        >>> import numpy as np
        >>> from tb_introspect import metadata, stats_np, summary_pb
        >>> rows = [metadata.stats_tag("gradient", n) for n in ("dense/kernel", "dense/bias")]
        >>> vecs = [stats_np.tensor_stats(np.ones(4), "gradient") for _ in rows]
        >>> value = summary_pb.view_summary_value("gradient", rows, vecs)
        >>> value.tag, value.array.shape
        ('introspect/summary/gradient', (2, 9))
    """
    width = len(slots.tensor_stats_fields(view, quantiles))
    v = np.asarray(vectors, dtype=np.float64)
    if v.shape != (len(rows), width):
        raise ValueError(f"{view} summary: vectors have shape {v.shape}, expected"
                         f" ({len(rows)}, {width}) (rows, slots)")
    meta = metadata.create_view_summary_metadata(
        view=view, rows=rows, cadence=cadence) if with_metadata else None
    return Value(metadata.summary_tag(view), view_summary(view, rows, v, quantiles), meta)


def view_summary_pb(view: str, rows: Sequence[str], vectors,
                    **described: Any) -> summary_pb2.Summary:
    """``view_summary_value`` (the same keywords) as a ``Summary`` proto."""
    return encode([view_summary_value(view, rows, vectors, **described)])


def probes_value(
    probes: Mapping[str, Sequence[float] | np.ndarray],
    *,
    epoch: int = 0,
    rows: Sequence[str] | None = None,
    cadence: str = "step",
    with_metadata: bool = True,
) -> Value:
    """One logged point's PROBES matrix (format version 4).

    ``probes``: module name -> its ``slots.PROBE_VALUE_FIELDS`` (NaN where a probe does
    not apply). ``rows``: the modules the matrix covers, in order (default: ``probes``'
    names); keep them the same at every point of a run, as with ``view_summary_value``, and
    write the metadata with the tag's first point only.

    Example:
        >>> nan = float("nan")
        >>> value = probes_value({"h.0.attn": [nan, nan, 12.5, nan, nan]}, epoch=1)
        >>> value.tag, float(value.array[0, 4])
        ('introspect/probes', 12.5)
    """
    rows = list(probes) if rows is None else list(rows)
    meta = metadata.create_probes_metadata(
        rows=rows, cadence=cadence) if with_metadata else None
    return Value(metadata.probes_tag(), probes_matrix(rows, probes, epoch), meta)


def probes_pb(probes: Mapping[str, Sequence[float] | np.ndarray],
              **described: Any) -> summary_pb2.Summary:
    """``probes_value`` (the same keywords) as a ``Summary`` proto."""
    return encode([probes_value(probes, **described)])


class ViewSummaries:
    """The metadata, VIEW_SUMMARY and PROBES bookkeeping of one writer, shared by every
    writer of the package.

    A tag's first summary in an event file carries its metadata, later ones none
    (TensorBoard keeps a tag's first metadata): building it for every tensor at every
    point was a fifth of a large model's point on the host. Each view's rows are fixed at
    its first point: the tags of that point, in order. At later points the vectors are
    placed by tag (a row without one is NaN) and tags that are not rows are left out (the
    plugin then reads that view from its per-tensor tags). The probes' rows (module names)
    are kept the same way. Its methods return :class:`Value` s (:func:`encode` makes the
    protos).
    """

    def __init__(self) -> None:
        self.rows: dict[str, tuple[str, ...]] = {}
        self.probe_rows: tuple[str, ...] | None = None
        self._index: dict[str, dict[str, int]] = {}
        self._described: set[str] = set()  # views and tags whose metadata the file has

    def restart(self) -> None:
        """A new writer object (a new event file): each tag's next summary carries its
        metadata again, each view's with the same rows."""
        self._described.clear()

    def tensor_stats(self, stats_vector: Sequence[float] | np.ndarray, *, view: str,
                     name: str, **described) -> Value:
        """``tensor_stats_value`` of one tensor at one point (``described``: its other
        keywords), with the metadata if the tag has none in this event file yet."""
        tag = metadata.stats_tag(view, name)
        first = tag not in self._described
        value = tensor_stats_value(stats_vector, view=view, name=name, with_metadata=first,
                                   **described)
        self._described.add(tag)
        return value

    def activity(self, channel_rates: Sequence[float] | np.ndarray,
                 spatial_rates: Sequence[float] | np.ndarray = (), *, name: str,
                 **described) -> Value:
        """``activity_value`` of one output at one epoch (``described``: its other keywords),
        with the metadata if the tag has none in this event file yet."""
        tag = metadata.activity_tag(name)
        first = tag not in self._described
        self._described.add(tag)
        return activity_value(channel_rates, spatial_rates, name=name, with_metadata=first,
                              **described)

    def probes(self, probes: Mapping[str, Sequence[float] | np.ndarray], *, epoch: int = 0,
               cadence: str = "step") -> Value | None:
        """The PROBES value of one point (``probes``: module -> its probe values); None
        when the point has none."""
        if not probes:
            return None
        if self.probe_rows is None:
            self.probe_rows = tuple(probes)
        first = metadata.probes_tag() not in self._described
        self._described.add(metadata.probes_tag())
        return probes_value(probes, epoch=epoch, rows=self.probe_rows, cadence=cadence,
                            with_metadata=first)

    def summary(
        self,
        view: str,
        tags: Sequence[str],
        vectors,
        *,
        quantiles: Sequence[float] = slots.DEFAULT_QUANTILES,
        cadence: str = "step",
    ) -> Value | None:
        """The VIEW_SUMMARY value of ``view`` at one point whose tensors' tags are ``tags``
        and packed vectors ``vectors`` (``[len(tags), slots]``); None when the point has no
        tensor."""
        if not len(tags):
            return None
        width = len(slots.tensor_stats_fields(view, quantiles))
        v = np.asarray(vectors, dtype=np.float64).reshape(len(tags), width)
        if view not in self.rows:
            self.rows[view] = tuple(dict.fromkeys(tags))  # a repeated tag is one row
            self._index[view] = {t: i for i, t in enumerate(self.rows[view])}
        index = self._index[view]
        packed = np.full((len(index), width), np.nan)
        for tag, vec in zip(tags, v, strict=True):
            i = index.get(tag)
            if i is not None:
                packed[i] = vec
        first = view not in self._described
        self._described.add(view)
        return view_summary_value(view, self.rows[view], packed, quantiles=quantiles,
                                  cadence=cadence, with_metadata=first)


def __getattr__(name: str):
    if name == "tensor_stats_pb_from_array":  # it computes statistics: the engine's side
        raise AttributeError(f"{__name__}.{name} moved to tb_introspect.writer.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
