"""The Introspect TensorBoard plugin: loader, routes and registration.

Routes and their JSON are documented in ``docs/http_api.md``. All data comes
from ``context.data_provider`` (works with ``--load_fast`` true and false).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
from tensorboard import errors as tb_errors
from tensorboard import plugin_util
from tensorboard.plugins import base_plugin
from werkzeug import wrappers

from tb_introspect import metadata
from tb_introspect.plugin import assets, overview, reader
from tb_introspect.plugin.cache import FingerprintCache
from tb_introspect.plugin.http_io import (
    RequestError,
    encode,
    error_response,
    gzip_bytes,
    gzipped_json_response,
    int_list,
    json_response,
    non_negative_int,
    not_found,
    num_list,
    repeated,
    required,
)

logger = logging.getLogger(__name__)

PLUGIN_NAME = metadata.PLUGIN_NAME


#: Seconds a run's tag listing is reused across requests (see ``_list_run``).
LISTING_TTL_S = 1.0


class _Listing(NamedTuple):
    infos: dict[str, reader.TagInfo]
    bad: list[tuple[str, str]]
    at: float
    fingerprint: tuple


class _Documents(NamedTuple):
    run: bytes  # gzip of the ./run JSON
    overview: bytes  # gzip of the ./overview JSON at the default max_points


class IntrospectLoader(base_plugin.TBLoader):
    """Loads the plugin and makes TensorBoard keep every tb-introspect point."""

    def fix_flags(self, flags: Any) -> None:
        """Default ``--samples_per_plugin introspect=all`` unless the user gave a value.

        Ingest otherwise keeps a random reservoir per tag (10 points in the
        Python loader, 100 in the Rust data server), which would hide the
        training dynamics this plugin exists to show. ``0`` means "all".
        """
        hints = getattr(flags, "samples_per_plugin", None)
        if isinstance(hints, str):  # flags built by hand instead of by argparse
            hints = _parse_samples_per_plugin(hints)
        hints = dict(hints or {})
        hints.setdefault(PLUGIN_NAME, 0)
        flags.samples_per_plugin = hints

    def load(self, context: base_plugin.TBContext) -> IntrospectPlugin:
        """The plugin instance for this TensorBoard."""
        return IntrospectPlugin(context)


def _parse_samples_per_plugin(value: str) -> dict[str, int]:
    result = {}
    for token in value.split(","):
        if token.strip():
            key, _, number = token.strip().partition("=")
            result[key.strip()] = int(number)
    return result


def _route(method: Callable[..., Any]) -> Callable[..., Any]:
    """Turns a route method into a WSGI app that answers bad input with 4xx JSON."""

    @functools.wraps(method)
    def app(self: IntrospectPlugin, environ, start_response):
        request = wrappers.Request(environ)
        try:
            response = method(self, request)
        except RequestError as e:
            response = error_response(request, e)
        except tb_errors.PublicError as e:  # e.g. an unknown experiment
            response = error_response(request, RequestError(str(e), e.http_code))
        return response(environ, start_response)

    return app


class IntrospectPlugin(base_plugin.TBPlugin):
    """Serves per-layer statistics of weights, gradients and activations."""

    plugin_name = PLUGIN_NAME

    def __init__(self, context: base_plugin.TBContext) -> None:
        """Keeps the data provider; nothing is read until a route is called."""
        self._provider = context.data_provider
        self.listing_ttl_s = LISTING_TTL_S
        self._listings: dict[tuple[str, str], _Listing] = {}
        self._all_listings: dict[str, tuple[dict, dict, float]] = {}
        self._listings_lock = threading.Lock()
        # One refresh per key at a time: concurrent misses would each pay a full listing.
        self._refresh_locks: dict[object, threading.Lock] = {}
        # Rendered documents per run, valid while the run's fingerprint holds.
        mib = 2**20
        self._documents = FingerprintCache(16, 256 * mib, lambda d: len(d.run) + len(d.overview))
        self._overviews = FingerprintCache(8, 64 * mib)
        self._series = FingerprintCache(256, 64 * mib)
        # Full reads of runs: ./series answers from them instead of asking the provider again.
        self._full_runs = FingerprintCache(4, 512 * mib, _run_nbytes)

    def is_active(self) -> bool:
        """Always ``False``: TensorBoard activates the tab from ``data_plugin_names``."""
        return False

    def frontend_metadata(self) -> base_plugin.FrontendMetadata:
        """The tab: an ES module rendered in an iframe."""
        return base_plugin.FrontendMetadata(es_module_path="/index.js", tab_name="Introspect")

    def get_plugin_apps(self) -> dict[str, Callable[..., Any]]:
        """Route table (see docs/http_api.md)."""
        return {
            "/runs": self._serve_runs,
            "/run": self._serve_run,
            "/series": self._serve_series,
            "/overview": self._serve_overview,
            "/index.js": self._serve_index,
            "/static/*": self._serve_static,
        }

    # -- data access ---------------------------------------------------------

    def _check_provider(self) -> None:
        if self._provider is None:
            raise RequestError("TensorBoard has no data provider; cannot read data", 503)

    def _list_run(
        self, request: wrappers.Request, run: str
    ) -> _Listing:
        """Tags, skipped tags and fingerprint of one run; 404 when it has no data.

        A listing is reused for ``LISTING_TTL_S``: the frontend sends bursts of
        requests for one run, and each provider call costs a round trip (about
        40 ms to the Rust data server). TensorBoard itself reloads far less often.
        """
        self._check_provider()
        key = (plugin_util.experiment_id(request.environ), run)
        now = time.monotonic()
        with self._listings_lock:
            hit = self._listings.get(key)
        if hit is not None and now - hit.at < self.listing_ttl_s:
            return hit
        with self._refresh_lock(key):
            with self._listings_lock:
                hit = self._listings.get(key)
            if hit is not None and time.monotonic() - hit.at < self.listing_ttl_s:
                return hit  # another request refreshed it while this one waited
            return self._refresh_run(request, key, run, now)

    def _refresh_lock(self, key: object) -> threading.Lock:
        with self._listings_lock:
            if len(self._refresh_locks) > 256:
                self._refresh_locks = {k: v for k, v in self._refresh_locks.items() if v.locked()}
            return self._refresh_locks.setdefault(key, threading.Lock())

    def _refresh_run(
        self, request: wrappers.Request, key: tuple[str, str], run: str, now: float
    ) -> _Listing:
        infos, bad = reader.list_tags(
            self._provider, key[0], ctx=plugin_util.context(request.environ), runs=[run]
        )
        if run not in infos and run not in bad:
            with self._listings_lock:
                self._listings.pop(key, None)
            raise not_found(f"run {run!r} not found or has no tb-introspect data")
        run_infos = infos.get(run, {})
        listing = _Listing(run_infos, bad.get(run, []), now, reader.fingerprint(run_infos))
        with self._listings_lock:
            if len(self._listings) > 256:  # runs come and go; keep the table small
                self._listings.clear()
            self._listings[key] = listing
        return listing

    def _list_all(
        self, request: wrappers.Request
    ) -> tuple[dict[str, dict[str, reader.TagInfo]], dict[str, list[tuple[str, str]]]]:
        """Every run's tags (one provider call); also refreshes the per-run listings."""
        self._check_provider()
        eid = plugin_util.experiment_id(request.environ)
        now = time.monotonic()
        with self._listings_lock:
            hit = self._all_listings.get(eid)
        if hit is not None and now - hit[2] < self.listing_ttl_s:
            return hit[0], hit[1]
        with self._refresh_lock(eid):
            with self._listings_lock:
                hit = self._all_listings.get(eid)
            if hit is not None and time.monotonic() - hit[2] < self.listing_ttl_s:
                return hit[0], hit[1]
            return self._refresh_all(request, eid, now)

    def _refresh_all(
        self, request: wrappers.Request, eid: str, now: float
    ) -> tuple[dict[str, dict[str, reader.TagInfo]], dict[str, list[tuple[str, str]]]]:
        infos, bad = reader.list_tags(
            self._provider, eid, ctx=plugin_util.context(request.environ)
        )
        with self._listings_lock:
            if len(self._listings) > 256:  # runs come and go; keep the table small
                self._listings.clear()
            for run in set(infos) | set(bad):
                run_infos = infos.get(run, {})
                self._listings[(eid, run)] = _Listing(
                    run_infos, bad.get(run, []), now, reader.fingerprint(run_infos)
                )
            self._all_listings[eid] = (infos, bad, now)
        return infos, bad

    def _read_run(
        self, request: wrappers.Request, run: str, infos: dict, bad: list
    ) -> reader.RunSeries:
        series, unreadable = reader.read_series(
            self._provider, plugin_util.experiment_id(request.environ), run, infos.values(),
            ctx=plugin_util.context(request.environ),
        )
        return reader.assemble_run(run, infos, series, bad + unreadable)

    def _full_run(self, request: wrappers.Request, run: str, listing: _Listing) -> reader.RunSeries:
        key = (plugin_util.experiment_id(request.environ), run)
        return self._full_runs.get(
            key, listing.fingerprint,
            lambda: self._read_run(request, run, listing.infos, listing.bad),
        )

    def _documents_of(self, request: wrappers.Request, run: str) -> _Documents:
        """The run's ``./run`` and default ``./overview`` bodies, from one full read."""
        listing = self._list_run(request, run)

        def render() -> _Documents:
            rs = self._full_run(request, run, listing)
            return _Documents(
                run=gzip_bytes(encode(_run_document(rs))),
                overview=gzip_bytes(encode(overview.compute_overview(rs))),
            )

        key = (plugin_util.experiment_id(request.environ), run)
        return self._documents.get(key, listing.fingerprint, render)

    # -- routes ----------------------------------------------------------------

    @_route
    def _serve_runs(self, request: wrappers.Request):
        infos, bad = self._list_all(request)
        runs = []
        for run in sorted(set(infos) | set(bad)):
            tags = infos.get(run, {}).values()
            views = {v: 0 for v in metadata.VIEWS}
            for t in tags:
                if t.kind == reader.KIND_TENSOR_STATS:
                    views[t.view] = views.get(t.view, 0) + 1
            runs.append({
                "run": run,
                "views": views,
                "metrics": sorted({t.name for t in tags if t.kind != reader.KIND_TENSOR_STATS}),
                "max_step": max((t.max_step for t in tags), default=None),
                "format_version": max((t.version for t in tags), default=None),
            })
        return json_response(request, {"runs": runs, "reader_version": metadata.PROTO_VERSION})

    @_route
    def _serve_run(self, request: wrappers.Request):
        run = required(request, "run")
        return gzipped_json_response(request, self._documents_of(request, run).run)

    @_route
    def _serve_series(self, request: wrappers.Request):
        run = required(request, "run")
        tags = repeated(request, "tag", required_=True)
        fields = repeated(request, "field")
        downsample = non_negative_int(request, "downsample", 0)
        listing = self._list_run(request, run)
        infos = listing.infos
        bad = [(t, r) for t, r in listing.bad if t in tags]
        missing = [t for t in tags if t not in infos and t not in dict(bad)]
        if missing:
            raise not_found(f"run {run!r} has no tb-introspect tag {missing[0]!r}"
                            + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
        infos = {t: infos[t] for t in tags if t in infos}
        if fields:
            known = {f for i in infos.values() for f in i.fields}
            unknown = [f for f in fields if f not in known]
            if unknown:
                raise RequestError(f"no requested tag has field {unknown[0]!r}")
        eid = plugin_util.experiment_id(request.environ)

        def render() -> bytes:
            full = self._full_runs.peek((eid, run), listing.fingerprint)
            if full is not None:
                have = full.all_series()
                series = {t: _downsample(have[t], downsample) for t in tags if t in have}
                unreadable = [(t, r) for t, r in full.skipped if t in tags and t not in dict(bad)]
            else:
                series, unreadable = reader.read_series(
                    self._provider, eid, run, [infos[t] for t in tags if t in infos],
                    ctx=plugin_util.context(request.environ), downsample=downsample,
                )
            return gzip_bytes(encode({
                "run": run,
                "series": {t: _series_json(series[t], fields) for t in tags if t in series},
                "skipped": [{"tag": t, "reason": r} for t, r in bad + unreadable],
            }))

        key = (eid, run, tuple(tags), tuple(fields), downsample)
        return gzipped_json_response(
            request, self._series.get(key, listing.fingerprint, render)
        )

    @_route
    def _serve_overview(self, request: wrappers.Request):
        run = required(request, "run")
        max_points = non_negative_int(request, "max_points", overview.DEFAULT_MAX_POINTS)
        if max_points == overview.DEFAULT_MAX_POINTS:
            return gzipped_json_response(request, self._documents_of(request, run).overview)
        listing = self._list_run(request, run)

        def render() -> bytes:
            rs = self._full_run(request, run, listing)
            return gzip_bytes(encode(overview.compute_overview(rs, max_points)))

        key = (plugin_util.experiment_id(request.environ), run, max_points)
        return gzipped_json_response(
            request, self._overviews.get(key, listing.fingerprint, render)
        )

    @wrappers.Request.application
    def _serve_index(self, request: wrappers.Request):
        return assets.respond_index(request)

    @_route
    def _serve_static(self, request: wrappers.Request):
        marker = f"/plugin/{PLUGIN_NAME}/static/"
        path = request.path
        i = path.find(marker)
        if i < 0:
            raise not_found(f"no static file {path!r}")
        return assets.respond_file(request, path[i + len(marker):])


def _run_document(rs: reader.RunSeries) -> dict[str, Any]:
    """The ``./run`` JSON of a run (see docs/http_api.md)."""
    views: dict[str, list] = {v: [] for v in metadata.VIEWS}
    for view, series in rs.tensors.items():
        views[view] = [_tensor_entry(s) for s in series]
    names = sorted(set(rs.metrics) | set(rs.metric_epochs))
    return {
        "run": rs.run,
        "format_version": rs.format_version,
        "reader_version": metadata.PROTO_VERSION,
        "views": views,
        "metrics": [_metric_entry(n, rs.metrics.get(n), rs.metric_epochs.get(n)) for n in names],
        "skipped": [{"tag": t, "reason": r} for t, r in rs.skipped],
    }


def _tensor_entry(s: reader.Series) -> dict[str, Any]:
    i = s.info
    epochs = s.epochs
    return {
        "tag": i.tag, "name": i.name, "layer": i.layer, "depth": i.depth,
        "shape": list(i.shape), "dtype": i.dtype, "cadence": i.cadence,
        "fields": list(i.fields), "quantiles": num_list(i.quantiles),
        "num_points": len(s),
        "first_step": int(s.steps[0]) if len(s) else None,
        "last_step": int(s.steps[-1]) if len(s) else None,
        "first_epoch": int_list(epochs[:1])[0] if len(s) else None,
        "last_epoch": int_list(epochs[-1:])[0] if len(s) else None,
    }


def _metric_entry(
    name: str, step: reader.Series | None, per_epoch: reader.Series | None
) -> dict[str, Any]:
    main = step if step is not None else per_epoch
    return {
        "name": name,
        "tag": step.info.tag if step is not None else None,
        "epoch_tag": per_epoch.info.tag if per_epoch is not None else None,
        "num_points": len(step) if step is not None else 0,
        "first_step": int(main.steps[0]) if len(main) else None,
        "last_step": int(main.steps[-1]) if len(main) else None,
        "num_epochs": len(per_epoch) if per_epoch is not None
        else len({e for e in int_list(step.epochs) if e is not None}),
    }


def _run_nbytes(rs: reader.RunSeries) -> int:
    return sum(s.values.nbytes + s.steps.nbytes for s in rs.all_series().values())


def _downsample(s: reader.Series, k: int) -> reader.Series:
    """At most ``k`` evenly spaced points of ``s``, first and last kept (0 = all)."""
    if k <= 0 or len(s) <= k:
        return s
    idx = np.unique(np.linspace(0, len(s) - 1, k).round().astype(np.int64))
    return reader.Series(s.info, s.steps[idx], s.wall_times[idx], s.values[idx])


def _series_json(s: reader.Series, fields: list[str]) -> dict[str, Any]:
    i = s.info
    out: dict[str, Any] = {"kind": i.kind, "name": i.name}
    if i.kind == reader.KIND_TENSOR_STATS:
        out.update({
            "view": i.view, "layer": i.layer, "depth": i.depth, "shape": list(i.shape),
            "dtype": i.dtype, "cadence": i.cadence, "quantiles": num_list(i.quantiles),
        })
    wanted = fields or [f for f in i.fields if f != "epoch"]
    out["steps"] = s.steps.tolist()
    out["epochs"] = int_list(s.epochs)
    out["wall_times"] = num_list(s.wall_times)
    out["values"] = {f: num_list(s.field(f)) for f in wanted if s.has(f)}
    return out
