"""Read tb-introspect summaries from a TensorBoard data provider into numpy series.

This is the only way to a run's data, and it is independent of HTTP: the plugin's routes
and overview and ``tb-introspect diagnose`` all use :func:`read_run` or :func:`read_logdir`,
which return the run data model of :mod:`tb_introspect.read.series` (``RunSeries``); the
findings judged during training assemble what was written with the same
:func:`parse_tag_info`, :func:`series_from_datums` and :func:`assemble_run`. No TensorFlow
is imported here.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
from tensorboard import context as tb_context
from tensorboard.data import provider as tb_provider

from tb_introspect import metadata, slots
from tb_introspect.read.series import RunSeries, Series, TagInfo

__all__ = [
    "ALL_POINTS", "KIND_ACTIVITY_MAP", "KIND_METRIC", "KIND_METRIC_EPOCH", "KIND_PROBES",
    "KIND_TENSOR_STATS", "KIND_VIEW_SUMMARY", "assemble_run", "fingerprint", "list_tags",
    "local_provider", "parse_tag_info", "read_logdir", "read_run", "read_series",
    "series_from_datums", "warn_skipped_tag",
]

logger = logging.getLogger(__name__)

PLUGIN_NAME = metadata.PLUGIN_NAME

#: ``downsample`` value that keeps every point. A data provider returns nothing
#: for ``downsample=0``, so "all" has to be spelled as a large number.
ALL_POINTS = 1_000_000_000

KIND_TENSOR_STATS = "tensor_stats"
KIND_METRIC = "metric"
KIND_METRIC_EPOCH = "metric_epoch"
KIND_ACTIVITY_MAP = "activity_map"
KIND_VIEW_SUMMARY = "view_summary"
KIND_PROBES = "probes"
_KIND_NAMES = {
    metadata.TENSOR_STATS: KIND_TENSOR_STATS,
    metadata.METRIC: KIND_METRIC,
    metadata.METRIC_EPOCH: KIND_METRIC_EPOCH,
    metadata.ACTIVITY_MAP: KIND_ACTIVITY_MAP,
    metadata.VIEW_SUMMARY: KIND_VIEW_SUMMARY,
    metadata.PROBES: KIND_PROBES,
}


def parse_tag_info(
    tag: str, content: bytes, max_step: int = -1, max_wall_time: float = 0.0
) -> TagInfo:
    """Build a :class:`TagInfo` from plugin content; ``ValueError`` when unusable."""
    data = metadata.parse_plugin_data(content)
    kind = _KIND_NAMES.get(data.kind)
    if kind is None:
        raise ValueError(f"unknown summary kind {data.kind}")
    if not data.fields:
        raise ValueError("metadata lists no fields")
    if kind in (KIND_TENSOR_STATS, KIND_VIEW_SUMMARY) and not data.view:
        raise ValueError(f"{kind} without a view")
    if kind in (KIND_VIEW_SUMMARY, KIND_PROBES) and not data.rows:
        raise ValueError(f"{kind.replace('_', ' ')} lists no rows")
    return TagInfo(
        tag=tag,
        kind=kind,
        version=int(data.version),
        name=data.name or tag,
        fields=tuple(data.fields),
        view=data.view,
        layer=data.layer or data.name,
        depth=int(data.depth),
        shape=tuple(int(d) for d in data.shape),
        dtype=data.dtype,
        cadence=data.cadence or "step",
        quantiles=tuple(float(q) for q in data.quantiles),
        max_step=int(max_step),
        max_wall_time=float(max_wall_time),
        rows=tuple(data.rows),
        loss=data.loss,
    )


def list_tags(
    data_provider: tb_provider.DataProvider,
    experiment_id: str,
    *,
    ctx=None,
    runs: Sequence[str] | None = None,
    tags: Sequence[str] | None = None,
) -> tuple[dict[str, dict[str, TagInfo]], dict[str, list[tuple[str, str]]]]:
    """List tb-introspect tags (metadata only, no points).

    Returns ``(infos, skipped)``: ``infos[run][tag]`` and, per run, the
    ``(tag, reason)`` pairs whose metadata could not be parsed (also logged).
    """
    listing = data_provider.list_tensors(
        _ctx(ctx),
        experiment_id=experiment_id,
        plugin_name=PLUGIN_NAME,
        run_tag_filter=_filter(runs, tags),
    )
    infos: dict[str, dict[str, TagInfo]] = {}
    skipped: dict[str, list[tuple[str, str]]] = {}
    for run, by_tag in listing.items():
        run_infos = infos.setdefault(run, {})
        for tag, ts in by_tag.items():
            try:
                run_infos[tag] = parse_tag_info(
                    tag, ts.plugin_content, ts.max_step, ts.max_wall_time
                )
            except ValueError as e:
                warn_skipped_tag(run, tag, str(e))
                skipped.setdefault(run, []).append((tag, str(e)))
    return infos, skipped


_warned: set[tuple[str, str, str]] = set()


def warn_skipped_tag(run: str, tag: str, reason: str) -> None:
    """Log that ``tag`` of ``run`` is left out for ``reason``, once per process and problem."""
    # Once only: every reload reads the tag again.
    if (run, tag, reason) not in _warned:
        _warned.add((run, tag, reason))
        logger.warning("tb-introspect: skipping tag %r of run %r: %s", tag, run, reason)


def fingerprint(infos: Mapping[str, TagInfo]) -> tuple:
    """A value that changes whenever the data provider reports new points for a tag."""
    return tuple(sorted((t.tag, t.max_step, t.max_wall_time) for t in infos.values()))


def read_series(
    data_provider: tb_provider.DataProvider,
    experiment_id: str,
    run: str,
    infos: Iterable[TagInfo],
    *,
    ctx=None,
    downsample: int | None = None,
) -> tuple[dict[str, Series], list[tuple[str, str]]]:
    """Read the points of ``infos``' tags of ``run``; one narrowed provider read.

    ``downsample``: keep at most this many points per tag; ``None`` or ``0``
    keeps all. Returns ``(series by tag, skipped (tag, reason) pairs)``; a tag
    whose tensors do not match its layout's length is skipped with a warning.
    """
    infos = {i.tag: i for i in infos}
    if not infos:
        return {}, []
    data = data_provider.read_tensors(
        _ctx(ctx),
        experiment_id=experiment_id,
        plugin_name=PLUGIN_NAME,
        downsample=ALL_POINTS if not downsample else int(downsample),
        run_tag_filter=tb_provider.RunTagFilter(runs=[run], tags=list(infos)),
    )
    out: dict[str, Series] = {}
    skipped: list[tuple[str, str]] = []
    for tag, datums in data.get(run, {}).items():
        info = infos.get(tag)
        if info is None:
            continue
        try:
            out[tag] = series_from_datums(info, datums)
        except ValueError as e:
            warn_skipped_tag(run, tag, str(e))
            skipped.append((tag, str(e)))
    return out, skipped


def series_from_datums(info: TagInfo, datums: Sequence[tb_provider.TensorDatum]) -> Series:
    """The :class:`Series` of ``info``'s tag from its points, upgraded to the current format.

    Raises ``ValueError`` when a point's tensor does not have ``info``'s layout length.
    """
    width = info.width
    n = len(datums)
    steps = np.fromiter((d.step for d in datums), dtype=np.int64, count=n)
    wall_times = np.fromiter((d.wall_time for d in datums), dtype=np.float64, count=n)
    arrays = [d.numpy for d in datums]
    sizes = np.fromiter((a.size for a in arrays), dtype=np.int64, count=n)
    bad = np.flatnonzero(sizes != width)
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"tensor at step {datums[i].step} has {sizes[i]} values,"
            f" layout has {width} fields"
        )
    if n:
        values = np.concatenate(arrays, axis=None).astype(np.float64, copy=False)
        values = values.reshape(n, width)
    else:
        values = np.empty((0, width), dtype=np.float64)
    values = slots.upgrade_values(info.version, info.fields, values)
    return Series(info=info, steps=steps, wall_times=wall_times, values=values)


def assemble_run(
    run: str, infos: Mapping[str, TagInfo], series: Mapping[str, Series],
    skipped: Iterable[tuple[str, str]] = (),
) -> RunSeries:
    """Group a run's series by view (depth order) and metric name."""
    result = RunSeries(run=run, skipped=list(skipped))
    result.format_version = max((i.version for i in infos.values()), default=0)
    for info in sorted(infos.values(), key=TagInfo.sort_key):
        s = series.get(info.tag)
        if s is None:
            continue
        if info.kind == KIND_TENSOR_STATS:
            result.tensors.setdefault(info.view, []).append(s)
        elif info.kind == KIND_METRIC:
            result.metrics[info.name] = s
        elif info.kind == KIND_METRIC_EPOCH:
            result.metric_epochs[info.name] = s
        elif info.kind == KIND_ACTIVITY_MAP:
            result.activity[info.name] = s
        elif info.kind == KIND_PROBES and info.tag == metadata.probes_tag():
            result.probes = s
        # VIEW_SUMMARY tags repeat slots of the TENSOR_STATS tags (plugin.summaries reads them)
    # Views in the format's order, unknown (newer) views after them.
    order = {v: i for i, v in enumerate(slots.VIEWS)}
    result.tensors = dict(
        sorted(result.tensors.items(), key=lambda kv: (order.get(kv[0], len(order)), kv[0]))
    )
    return result


def read_run(
    data_provider: tb_provider.DataProvider,
    experiment_id: str,
    run: str,
    *,
    ctx=None,
    downsample: int | None = None,
) -> RunSeries:
    """All tb-introspect series of ``run`` as a :class:`RunSeries`.

    Works with any TensorBoard data provider (the one a plugin gets in its
    context, or the local one :func:`read_logdir` builds). Raises ``KeyError``
    when the run has no tb-introspect data.
    """
    infos, bad = list_tags(data_provider, experiment_id, ctx=ctx, runs=[run])
    if run not in infos and run not in bad:
        raise KeyError(f"run {run!r} has no tb-introspect data")
    run_infos = infos.get(run, {})
    wanted = [i for i in run_infos.values() if i.kind != KIND_VIEW_SUMMARY]
    series, unreadable = read_series(
        data_provider, experiment_id, run, wanted, ctx=ctx, downsample=downsample
    )
    return assemble_run(run, run_infos, series, bad.get(run, []) + unreadable)


def local_provider(logdir: str) -> tb_provider.DataProvider:
    """A data provider over an event-file directory, keeping every point.

    Uses TensorBoard's Python event loader (no server, no TensorFlow).
    Subdirectories holding event files become runs named by relative path.
    """
    # Imported here: only offline readers need the multiplexer.
    from tensorboard.backend.event_processing import data_provider as mux_provider
    from tensorboard.backend.event_processing import plugin_event_multiplexer

    if not os.path.isdir(logdir):
        raise FileNotFoundError(f"log directory {logdir!r} does not exist")
    multiplexer = plugin_event_multiplexer.EventMultiplexer(
        tensor_size_guidance={PLUGIN_NAME: 0},  # 0 = keep every point
        max_reload_threads=1,
    )
    multiplexer.AddRunsFromDirectory(logdir)
    multiplexer.Reload()
    return mux_provider.MultiplexerDataProvider(multiplexer, logdir)


def read_logdir(logdir: str, runs: Sequence[str] | None = None) -> dict[str, RunSeries]:
    """Every run of ``logdir`` with tb-introspect data, as ``{run: RunSeries}``.

    ``runs`` narrows the result to those run names (relative paths). This is
    the entry point for offline tools such as ``tb-introspect diagnose``.
    """
    dp = local_provider(logdir)
    infos, bad = list_tags(dp, "", runs=runs)
    out = {}
    for run in sorted(set(infos) | set(bad)):
        run_infos = infos.get(run, {})
        series, unreadable = read_series(dp, "", run, run_infos.values())
        out[run] = assemble_run(run, run_infos, series, bad.get(run, []) + unreadable)
    return out


def _ctx(ctx):
    # Providers insist on a RequestContext; offline callers have none.
    return ctx if ctx is not None else tb_context.RequestContext()


def _filter(
    runs: Sequence[str] | None, tags: Sequence[str] | None
) -> tb_provider.RunTagFilter | None:
    if runs is None and tags is None:
        return None
    return tb_provider.RunTagFilter(runs=runs, tags=tags)
