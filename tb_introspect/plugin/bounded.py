"""Data provider reads whose size is bounded, however long the run.

TensorBoard's Rust data server answers ``read_tensors`` in one gRPC message,
and gRPC refuses messages over 256 MiB: a run of about 870,000 points read
in one call made every route answer 500. The Python loader has no
such limit, but the time and memory of one call grow the same way. Here every
call is planned from the tags' layouts before it is made:

- a call reads at most :data:`CALL_BYTES` (64 MiB) by the estimate of
  :func:`point_bytes`, whatever the run's length: sampled reads group tags
  (``tags x points per tag`` stays under the bound), and a full-resolution
  read asks for one tag at a time, at most :func:`full_points` of its points;
- the data provider keeps the last point and samples the others uniformly
  (the same indices for tags of equal length, so the tags of a view stay
  aligned).

Every point stays on disk and in the provider (``samples_per_plugin`` stays
``all``); only what one request carries is bounded.

TensorBoard's Python loader (``--load_fast=false``) converts *every* point of
a tag to numpy before it applies ``downsample``, so through its data provider
a sample costs as much as the whole run. Where
TensorBoard hands plugins its in-memory multiplexer (that loader only,
``TBContext.multiplexer``), :func:`read` picks the sampled events there and
converts only those.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tensorboard.data import provider as tb_provider
from tensorboard.util import tensor_util

from tb_introspect.plugin.overview import column_subset
from tb_introspect.read.provider import read_series, series_from_datums, warn_skipped_tag
from tb_introspect.read.series import Series, TagInfo

#: The most bytes one ``read_tensors`` call may carry (estimated, see point_bytes).
CALL_BYTES = 64 * 2**20
#: Bytes of one point on the wire besides its values: step, wall time, dtype, shape.
POINT_OVERHEAD = 64


def point_bytes(info: TagInfo) -> int:
    """Upper estimate of one point of ``info``'s tag in a provider response (float64 values)."""
    return 8 * info.width + POINT_OVERHEAD


def full_points(info: TagInfo) -> int:
    """The most points of one tag a single full-resolution call asks for."""
    return max(1, CALL_BYTES // point_bytes(info))


def plan(infos: Iterable[TagInfo], points: int) -> list[list[TagInfo]]:
    """Groups of tags, in order, each readable at ``points`` per tag within CALL_BYTES."""
    groups: list[list[TagInfo]] = []
    size = 0
    for info in infos:
        cost = points * point_bytes(info)
        if not groups or size + cost > CALL_BYTES:
            groups.append([])
            size = 0
        groups[-1].append(info)
        size += cost
    return groups


def subsample(s: Series, k: int) -> Series:
    """At most ``k`` evenly strided points of ``s``, the first and last kept (0 = all)."""
    if k <= 0 or len(s) <= k:
        return s
    # One copy of the striding for the whole plugin: the overview's column choice.
    idx = column_subset(len(s), k)
    return Series(s.info, s.steps[idx], s.wall_times[idx], s.values[idx])


def read(
    provider, experiment_id: str, run: str, infos: Sequence[TagInfo], *,
    ctx=None, points: int = 0, multiplexer=None,
) -> tuple[dict[str, Series], set[str], list[tuple[str, str]]]:
    """Read ``infos``' tags of ``run`` in bounded calls.

    ``points``: at most this many points per tag (0 = full resolution, up to
    :func:`full_points` per tag). ``multiplexer``: TensorBoard's in-memory
    event multiplexer when it offers one (Python loader), read directly for
    samples. Returns ``(series by tag, sampled tags, skipped (tag, reason))``;
    a tag is *sampled* when it holds more points than were returned.
    """
    if multiplexer is not None and points > 0:
        return _read_sample(multiplexer, run, infos, points)
    series: dict[str, Series] = {}
    sampled: set[str] = set()
    skipped: list[tuple[str, str]] = []
    if points > 0:
        calls = [(group, points) for group in plan(infos, points + 1)]
    else:
        calls = [([info], full_points(info)) for info in infos]
    for group, limit in calls:
        # One point more than wanted tells whether the tag holds more.
        got, bad = read_series(
            provider, experiment_id, run, group, ctx=ctx, downsample=limit + 1
        )
        skipped += bad
        for tag, s in got.items():
            if len(s) > limit:
                sampled.add(tag)
                s = subsample(s, limit)
            series[tag] = s
    return series, sampled, skipped


def _read_sample(
    multiplexer, run: str, infos: Sequence[TagInfo], points: int
) -> tuple[dict[str, Series], set[str], list[tuple[str, str]]]:
    """``points`` evenly strided events per tag (first and last kept), converted alone."""
    series: dict[str, Series] = {}
    sampled: set[str] = set()
    skipped: list[tuple[str, str]] = []
    for info in infos:
        try:
            events = multiplexer.Tensors(run, info.tag)
        except KeyError:  # gone since it was listed: as the provider, leave it out
            continue
        if len(events) > points:
            sampled.add(info.tag)
            events = [events[i] for i in column_subset(len(events), points)]
        datums = [
            tb_provider.TensorDatum(step=e.step, wall_time=e.wall_time,
                                    numpy=tensor_util.make_ndarray(e.tensor_proto))
            for e in events
        ]
        try:
            series[info.tag] = series_from_datums(info, datums)
        except ValueError as e:
            warn_skipped_tag(run, info.tag, str(e))
            skipped.append((info.tag, str(e)))
    return series, sampled, skipped


def sample_of(s: Series, was_sampled: bool, k: int) -> tuple[Series, bool]:
    """``s`` cut to ``k`` points (0 = as is) and whether it now lacks points of the tag."""
    out = subsample(s, k)
    return out, was_sampled or len(out) < len(s)


def nbytes(series: Iterable[Series]) -> int:
    """Memory held by the arrays of ``series``."""
    return int(sum(s.values.nbytes + s.steps.nbytes + s.wall_times.nbytes for s in series))
