"""A run's tag listing and its sampled read: the listing the plugin caches, how many points
per tag a sampled read takes, which tags it reads, and which tags ``./series`` and
``./export`` may read."""

from __future__ import annotations

from typing import NamedTuple

from tb_introspect.plugin import activity
from tb_introspect.plugin.http_io import RequestError, not_found
from tb_introspect.read import provider
from tb_introspect.read.series import RunSeries, TagInfo

#: Points per tag read for ``./run``, ``./overview`` and the grids: about one per
#: pixel column of a wide chart. Bounds the first read of a run of any length.
SAMPLED_POINTS = 1000
#: Points of all tags together in that read: runs with many tags get fewer per
#: tag (781 tags: 320, about a grid panel's width), never under MIN_SAMPLED_POINTS.
#: Each point costs the data provider Python time (docs/benchmarks.md).
RUN_SAMPLED_POINTS = 250_000
MIN_SAMPLED_POINTS = 200


def sample_points(tags: int) -> int:
    """Points per tag of a run's sampled read."""
    share = RUN_SAMPLED_POINTS // max(1, tags)
    return max(MIN_SAMPLED_POINTS, min(SAMPLED_POINTS, share))


class Listing(NamedTuple):
    infos: dict[str, TagInfo]
    bad: list[tuple[str, str]]
    fingerprint: tuple


def listing_of(infos: dict[str, TagInfo], bad: list[tuple[str, str]]) -> Listing:
    return Listing(infos, bad, provider.fingerprint(infos))


class Sampled(NamedTuple):
    """A run read at ``points`` per tag; ``sampled``: tags with more points."""

    rs: RunSeries
    sampled: frozenset[str]
    points: int


def sampled_infos(listing: Listing) -> list[TagInfo]:
    """The tags of a run's per-tensor sample: activity maps are read on demand (./activity:
    one point can hold 50k values), and view summaries repeat slots of the tensors' tags."""
    return [i for i in listing.infos.values()
            if i.kind not in (provider.KIND_ACTIVITY_MAP, provider.KIND_VIEW_SUMMARY)]


def series_tags(listing: Listing, run: str, tags: list[str]
                 ) -> tuple[dict[str, TagInfo], list[tuple[str, str]]]:
    """``tags`` of ``run`` as ``./series`` and ``./export`` read them: (the readable ones'
    infos, (tag, reason) of the unreadable ones). 404 for a tag the run does not have, 400
    for an activity map."""
    bad = [(t, r) for t, r in listing.bad if t in tags]
    missing = [t for t in tags if t not in listing.infos and t not in dict(bad)]
    if missing:
        raise not_found(f"run {run!r} has no tb-introspect tag {missing[0]!r}"
                        + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    infos = {t: listing.infos[t] for t in tags if t in listing.infos}
    maps = [t for t, i in infos.items() if activity.is_activity(i)]
    if maps:
        raise RequestError(f"tag {maps[0]!r} is an activity map; read it with ./activity")
    held = [t for t, i in infos.items() if i.kind == provider.KIND_VIEW_SUMMARY]
    if held:
        raise RequestError(f"tag {held[0]!r} is a view summary; its rows are the tensors'"
                           " own tags, read those")
    rows = [t for t, i in infos.items() if i.kind == provider.KIND_PROBES]
    if rows:
        raise RequestError(f"tag {rows[0]!r} holds the probes of many rows; read it with"
                           " ./probes")
    return infos, bad
