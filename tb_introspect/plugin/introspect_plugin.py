"""The Introspect TensorBoard plugin: loader, routes and registration.

Routes and their JSON are documented in ``docs/http_api.md``. All data comes
from ``context.data_provider`` (works with ``--load_fast`` true and false),
in calls of bounded size (:mod:`tb_introspect.plugin.bounded`): ``./run``,
``./overview`` and the grids read a sample of about one point per pixel
column of every tag; full resolution is read one tag at a time. Activity maps
(tens of thousands of values per point) stay out of the sampled read: ``./activity``
reads one on demand.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, NamedTuple

from tensorboard import plugin_util
from tensorboard.plugins import base_plugin
from werkzeug import wrappers

from tb_introspect import metadata, slots
from tb_introspect.plugin import (
    activity,
    assets,
    bounded,
    export,
    overview,
    probes,
    run_document,
    sampling,
    summaries,
)
from tb_introspect.plugin.cache import FingerprintCache
from tb_introspect.plugin.http_io import (
    RequestError,
    encode,
    file_response,
    gzip_bytes,
    gzipped_json_response,
    json_response,
    non_negative_int,
    not_found,
    repeated,
    required,
    route,
)
from tb_introspect.read import provider
from tb_introspect.read.series import RunSeries, TagInfo

logger = logging.getLogger(__name__)

PLUGIN_NAME = metadata.PLUGIN_NAME


#: Seconds a run's tag listing is reused across requests (see ``_list_run``).
LISTING_TTL_S = 1.0


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


class IntrospectPlugin(base_plugin.TBPlugin):
    """Serves per-layer statistics of weights, gradients and activations."""

    plugin_name = PLUGIN_NAME

    def __init__(self, context: base_plugin.TBContext) -> None:
        """Keeps the data provider; nothing is read until a route is called."""
        self._provider = context.data_provider
        # Only the Python loader hands it out; samples are read from it (bounded.py).
        self._multiplexer = getattr(context, "multiplexer", None)
        # Tag listings ("run", eid, run) and ("all", eid), reused for a second, or
        # twice as long as they took (the Python loader scans every point to list:
        # ~6 s at 5M points); one refresh per key at a time, as for every entry.
        self._listings = FingerprintCache(1024, ttl_s=LISTING_TTL_S, ttl_per_cost=2.0)
        # Rendered documents per run, valid while the run's fingerprint holds.
        mib = 2**20
        self._documents = FingerprintCache(16, 256 * mib, lambda d: len(d.run) + len(d.overview))
        self._overviews = FingerprintCache(8, 64 * mib)
        self._series = FingerprintCache(256, 64 * mib)
        self._activity = FingerprintCache(64, 64 * mib)
        # Sampled reads of runs: ./series answers from them when the sample is enough.
        self._sampled = FingerprintCache(8, 256 * mib, lambda d: bounded.nbytes(
            d.rs.all_series().values()))
        # First-screen reads from view summaries, and the findings (from the sampled read).
        self._first = FingerprintCache(8, 128 * mib, lambda d: 0 if d is None else
                                       bounded.nbytes(d.rs.all_series().values()))
        self._findings = FingerprintCache(16, 16 * mib)
        self._probes = FingerprintCache(16, 16 * mib)

    @property
    def listing_ttl_s(self) -> float:
        """Seconds a tag listing is reused across requests."""
        return self._listings.ttl_s

    @listing_ttl_s.setter
    def listing_ttl_s(self, value: float) -> None:
        self._listings.ttl_s = value

    @property
    def clock(self) -> Callable[[], float]:
        """Seconds that tag listings age by: settable, so that a test can step a fake clock
        past ``listing_ttl_s`` rather than wait on the real one."""
        return self._listings.clock

    @clock.setter
    def clock(self, value: Callable[[], float]) -> None:
        self._listings.clock = value

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
            "/export": self._serve_export,
            "/overview": self._serve_overview,
            "/findings": self._serve_findings,
            "/activity": self._serve_activity,
            "/probes": self._serve_probes,
            "/index.js": self._serve_index,
            "/static/*": self._serve_static,
        }

    # -- data access ---------------------------------------------------------

    def _check_provider(self) -> None:
        if self._provider is None:
            raise RequestError("TensorBoard has no data provider; cannot read data", 503)

    def _list_run(self, request: wrappers.Request, run: str) -> sampling.Listing:
        """Tags, skipped tags and fingerprint of one run; 404 when it has no data.

        A listing is reused for ``LISTING_TTL_S``: the frontend sends bursts of
        requests for one run, and each provider call costs a round trip (to the
        Rust data server). TensorBoard itself reloads far less often.
        """
        self._check_provider()
        eid = plugin_util.experiment_id(request.environ)

        def refresh() -> sampling.Listing:
            infos, bad = provider.list_tags(
                self._provider, eid, ctx=plugin_util.context(request.environ), runs=[run]
            )
            if run not in infos and run not in bad:
                raise not_found(f"run {run!r} not found or has no tb-introspect data")
            return sampling.listing_of(infos.get(run, {}), bad.get(run, []))

        return self._listings.get(("run", eid, run), None, refresh)

    def _list_all(
        self, request: wrappers.Request
    ) -> tuple[dict[str, dict[str, TagInfo]], dict[str, list[tuple[str, str]]]]:
        """Every run's tags (one provider call); also refreshes the per-run listings."""
        self._check_provider()
        eid = plugin_util.experiment_id(request.environ)

        def refresh():
            started = self.clock()
            infos, bad = provider.list_tags(
                self._provider, eid, ctx=plugin_util.context(request.environ)
            )
            took = self.clock() - started
            for run in set(infos) | set(bad):
                self._listings.put(
                    ("run", eid, run), None,
                    sampling.listing_of(infos.get(run, {}), bad.get(run, [])),
                    cost_s=took,
                )
            return infos, bad

        return self._listings.get(("all", eid), None, refresh)

    def _sampled_run(self, request: wrappers.Request, run: str,
                     listing: sampling.Listing) -> sampling.Sampled:
        """The run at ``sample_points`` per tag, in bounded provider calls, cached."""
        eid = plugin_util.experiment_id(request.environ)

        def read() -> sampling.Sampled:
            infos = sampling.sampled_infos(listing)
            points = sampling.sample_points(len(infos))
            series, sampled, unreadable = bounded.read(
                self._provider, eid, run, infos,
                ctx=plugin_util.context(request.environ), points=points,
                multiplexer=self._multiplexer,
            )
            rs = provider.assemble_run(run, listing.infos, series, listing.bad + unreadable)
            return sampling.Sampled(rs, frozenset(sampled), points)

        return self._sampled.get((eid, run), listing.fingerprint, read)

    def _first_screen(self, request: wrappers.Request, run: str, listing: sampling.Listing
                      ) -> sampling.Sampled | None:
        """The run from its view summaries and metrics (a few tags, as many points each as
        the per-tensor sample has), cached; ``None`` when some view has no summary covering
        its tensors (format 1 and 2 runs): those read the per-tensor sample."""
        cover = summaries.covering(listing.infos)
        if cover is None:
            return None
        eid = plugin_util.experiment_id(request.environ)

        def read() -> sampling.Sampled | None:
            metrics = [i for i in listing.infos.values()
                       if i.kind in (provider.KIND_METRIC, provider.KIND_METRIC_EPOCH)]
            # The steps the per-tensor sample would give: the same Overview columns (its
            # JSON, a value per tensor and column, costs more than the read past ~300).
            points = sampling.sample_points(len(sampling.sampled_infos(listing)))
            series, sampled, unreadable = bounded.read(
                self._provider, eid, run, [*cover.values(), *metrics],
                ctx=plugin_util.context(request.environ), points=points,
                multiplexer=self._multiplexer,
            )
            tags = {i.tag: v for v, i in cover.items()}
            held = {tags[t]: s for t, s in series.items() if t in tags}
            if len(held) < len(tags) or any(summaries.mismatch(s) for s in held.values()):
                return None  # unreadable, or not the rows it names: the per-tensor sample
            rs = summaries.summary_run(
                run, listing.infos, held, {t: s for t, s in series.items() if t not in tags},
                listing.bad + unreadable)
            # A row's own tag may hold fewer points than its summary: its count is unknown.
            rows = {s.info.tag for view in rs.tensors.values() for s in view}
            return sampling.Sampled(rs, frozenset(sampled) | rows, points)

        return self._first.get((eid, run), listing.fingerprint, read)

    def _screen_run(self, request: wrappers.Request, run: str, listing: sampling.Listing
                    ) -> tuple[sampling.Sampled, bool]:
        """What the first screen is drawn from, and whether it holds every slot the findings
        need: the view summaries when the run has them, else the per-tensor sample."""
        first = self._first_screen(request, run, listing)
        if first is not None:
            return first, False
        return self._sampled_run(request, run, listing), True

    def _documents_of(self, request: wrappers.Request, run: str) -> _Documents:
        """The run's ``./run`` and default ``./overview`` bodies: from the view summaries
        (the findings then come from ``./findings``), else from one sampled read."""
        listing = self._list_run(request, run)

        def render() -> _Documents:
            d, findings = self._screen_run(request, run, listing)
            return _Documents(
                run=gzip_bytes(encode(run_document.document(d.rs, d.sampled, listing.infos))),
                overview=gzip_bytes(encode(overview.compute_overview(d.rs,
                                                                     findings=findings))),
            )

        key = (plugin_util.experiment_id(request.environ), run)
        return self._documents.get(key, listing.fingerprint, render)

    # -- routes ----------------------------------------------------------------

    @route
    def _serve_runs(self, request: wrappers.Request):
        infos, bad = self._list_all(request)
        runs = []
        for run in sorted(set(infos) | set(bad)):
            tags = infos.get(run, {}).values()
            views = {v: 0 for v in slots.VIEWS}
            for t in tags:
                if t.kind == provider.KIND_TENSOR_STATS:
                    views[t.view] = views.get(t.view, 0) + 1
            runs.append({
                "run": run,
                "views": views,
                "metrics": sorted({t.name for t in tags if t.kind in (
                    provider.KIND_METRIC, provider.KIND_METRIC_EPOCH)}),
                "max_step": max((t.max_step for t in tags), default=None),
                "format_version": max((t.version for t in tags), default=None),
            })
        return json_response(request, {"runs": runs, "reader_version": metadata.PROTO_VERSION})

    @route
    def _serve_run(self, request: wrappers.Request):
        run = required(request, "run")
        return gzipped_json_response(request, self._documents_of(request, run).run)

    @route
    def _serve_series(self, request: wrappers.Request):
        run = required(request, "run")
        tags = repeated(request, "tag", required_=True)
        fields = repeated(request, "field")
        downsample = non_negative_int(request, "downsample", 0)
        listing = self._list_run(request, run)
        infos, bad = sampling.series_tags(listing, run, tags)
        if fields:
            known = {f for i in infos.values() for f in i.fields}
            unknown = [f for f in fields if f not in known]
            if unknown:
                raise RequestError(f"no requested tag has field {unknown[0]!r}")
        eid = plugin_util.experiment_id(request.environ)

        def render() -> bytes:
            have = self._sampled.peek((eid, run), listing.fingerprint)
            if have is not None and 0 < downsample <= sampling.SAMPLED_POINTS:
                # From the sample behind ./run, no provider call: at most `downsample`
                # points, fewer when a run with many tags has a smaller sample (both are
                # about one point per pixel column; a zoom reads the tag in full).
                held = have.rs.all_series()
                series, sampled = {}, set()
                for t in tags:
                    if t in held:
                        series[t], cut = bounded.sample_of(held[t], t in have.sampled, downsample)
                        if cut:
                            sampled.add(t)
                listed_bad = dict(bad)
                unreadable = [(t, r) for t, r in have.rs.skipped
                              if t in tags and t not in listed_bad]
            else:
                series, sampled, unreadable = bounded.read(
                    self._provider, eid, run, [infos[t] for t in tags if t in infos],
                    ctx=plugin_util.context(request.environ), points=downsample,
                    multiplexer=self._multiplexer,
                )
            return gzip_bytes(encode({
                "run": run,
                "series": {t: export.series_json(series[t], fields, t in sampled)
                           for t in tags if t in series},
                "skipped": [{"tag": t, "reason": r} for t, r in bad + unreadable],
            }))

        key = (eid, run, tuple(tags), tuple(fields), downsample)
        return gzipped_json_response(
            request, self._series.get(key, listing.fingerprint, render)
        )

    @route
    def _serve_export(self, request: wrappers.Request):
        """One tag at full resolution as a CSV or JSON file (see docs/http_api.md)."""
        run, tag = required(request, "run"), required(request, "tag")
        fmt = request.args.get("format", "csv")
        if fmt not in export.FORMATS:
            raise RequestError(f"format must be one of {', '.join(export.FORMATS)}, not {fmt!r}")
        infos, bad = sampling.series_tags(self._list_run(request, run), run, [tag])
        if bad:
            raise RequestError(f"tag {tag!r} cannot be read: {bad[0][1]}")
        series, sampled, skipped = bounded.read(
            self._provider, plugin_util.experiment_id(request.environ), run, [infos[tag]],
            ctx=plugin_util.context(request.environ), multiplexer=self._multiplexer)
        if tag not in series:
            raise RequestError(f"tag {tag!r} cannot be read: {dict(skipped).get(tag)}")
        s = series[tag]
        body = export.csv_bytes(s) if fmt == "csv" else \
            export.json_bytes(run, s, tag in sampled)
        mime, ext = export.FORMATS[fmt]
        return file_response(request, body, mime, export.filename(run, tag, ext))

    @route
    def _serve_overview(self, request: wrappers.Request):
        run = required(request, "run")
        max_points = non_negative_int(request, "max_points", overview.DEFAULT_MAX_POINTS)
        if max_points == overview.DEFAULT_MAX_POINTS:
            return gzipped_json_response(request, self._documents_of(request, run).overview)
        listing = self._list_run(request, run)

        def render() -> bytes:
            d, findings = self._screen_run(request, run, listing)
            return gzip_bytes(encode(overview.compute_overview(d.rs, max_points,
                                                               findings=findings)))

        key = (plugin_util.experiment_id(request.environ), run, max_points)
        return gzipped_json_response(
            request, self._overviews.get(key, listing.fingerprint, render)
        )

    @route
    def _serve_findings(self, request: wrappers.Request):
        """The run's findings, from the sampled read of every tensor's own tag: what
        ``./overview`` leaves out when it is drawn from view summaries."""
        run = required(request, "run")
        listing = self._list_run(request, run)

        def render() -> bytes:
            rs = self._sampled_run(request, run, listing).rs
            findings, error = overview.findings_of(rs)
            doc: dict[str, Any] = {"run": run, "findings": findings}
            if error is not None:
                doc["findings_error"] = error
            return gzip_bytes(encode(doc))

        key = (plugin_util.experiment_id(request.environ), run)
        return gzipped_json_response(request, self._findings.get(key, listing.fingerprint,
                                                                 render))

    @route
    def _serve_probes(self, request: wrappers.Request):
        """The run's transformer probes per row and field (docs/http_api.md), from the
        sampled read, which also holds the output view's max|a| of the massive ratio."""
        run = required(request, "run")
        fields = repeated(request, "field")
        unknown = [f for f in fields if f not in probes.FIELDS]
        if unknown:
            raise RequestError(f"unknown probe field {unknown[0]!r}; expected some of"
                               f" {', '.join(probes.FIELDS)}")
        listing = self._list_run(request, run)

        def render() -> bytes:
            # A run without probes (format 1-3, probes off) is answered from its listing.
            rs = (self._sampled_run(request, run, listing).rs if probes.listing(listing.infos)
                  else RunSeries(run=run))
            return gzip_bytes(encode(probes.document(run, rs, fields)))

        key = (plugin_util.experiment_id(request.environ), run, tuple(fields))
        return gzipped_json_response(request, self._probes.get(key, listing.fingerprint,
                                                               render))

    @route
    def _serve_activity(self, request: wrappers.Request):
        run = required(request, "run")
        tag = required(request, "tag")
        listing = self._list_run(request, run)
        info = listing.infos.get(tag)
        if info is None:
            reason = dict(listing.bad).get(tag)
            raise not_found(f"run {run!r} has no readable activity map {tag!r}"
                            + (f" ({reason})" if reason else ""))
        if not activity.is_activity(info):
            raise RequestError(f"tag {tag!r} is not an activity map (kind {info.kind});"
                               " read it with ./series")
        eid = plugin_util.experiment_id(request.environ)

        def render() -> bytes:
            series, sampled, unreadable = bounded.read(
                self._provider, eid, run, [info], ctx=plugin_util.context(request.environ),
                points=0, multiplexer=self._multiplexer,
            )
            if tag not in series:
                reason = unreadable[0][1] if unreadable else "no points"
                raise not_found(f"activity map {tag!r} of run {run!r} cannot be read: {reason}")
            return gzip_bytes(encode(activity.document(run, series[tag], tag in sampled)))

        # The tag's own entry of the listing: new points of other tags (every training
        # step) leave a map of tens of thousands of values cached.
        fingerprint = (info.max_step, info.max_wall_time)
        return gzipped_json_response(
            request, self._activity.get((eid, run, tag), fingerprint, render))

    @wrappers.Request.application
    def _serve_index(self, request: wrappers.Request):
        return assets.respond_index(request)

    @route
    def _serve_static(self, request: wrappers.Request):
        marker = f"/plugin/{PLUGIN_NAME}/static/"
        path = request.path
        i = path.find(marker)
        if i < 0:
            raise not_found(f"no static file {path!r}")
        return assets.respond_file(request, path[i + len(marker):])
