"""Helpers for the plugin tests: synthetic runs in real event files, real TensorBoard processes.

The synthetic values are deterministic functions of (view, tensor, step) kept in
a ``Written`` record, so tests compare what the plugin serves with what was
written, computed independently of the plugin's code.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import zlib
from dataclasses import dataclass, field

import numpy as np
from tensorboard.backend import application
from tensorboard.backend.event_processing import data_provider as mux_provider
from tensorboard.backend.event_processing import plugin_event_multiplexer
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.plugins import base_plugin
from tensorboard.util import tensor_util
from werkzeug.test import Client

from tb_introspect import metadata, slots, summary_pb
from tb_introspect.pipeline.sink import EventSink
from tb_introspect.plugin import introspect_plugin
from tb_introspect.proto import plugin_data_pb2

# Tensors per view: (name, layer, depth). Listed out of depth order on purpose.
LAYOUT = {
    "variable": [("dense_1/kernel", "dense_1", 1), ("dense/kernel", "dense", 0),
                 ("dense/bias", "dense", 0), ("out/kernel", "out", 2)],
    "gradient": [("dense_1/kernel", "dense_1", 1), ("dense/kernel", "dense", 0),
                 ("dense/bias", "dense", 0), ("out/kernel", "out", 2)],
    "output": [("dense", "dense", 0), ("dense_1", "dense_1", 1), ("out", "out", 2)],
    "output_gradient": [("dense", "dense", 0), ("dense_1", "dense_1", 1)],
}
VIEW_SCALE = {"variable": 0.0, "gradient": -2.0, "output": 0.5, "output_gradient": -3.0}


@dataclass
class Written:
    """What a synthetic run holds: ``stats[tag] = (steps, {field: values})``."""

    stats: dict[str, tuple[np.ndarray, dict[str, np.ndarray]]] = field(default_factory=dict)
    metrics: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=dict)
    info: dict[str, tuple[str, str, int]] = field(default_factory=dict)


def stats_vector(view: str, name: str, depth: int, step: int, epoch: int) -> np.ndarray:
    """A deterministic packed TENSOR_STATS vector; rms spans orders of magnitude by depth."""
    fields = slots.tensor_stats_fields(view)
    rng = np.random.default_rng(zlib.crc32(f"{view}|{name}|{step}".encode()))
    values = dict(zip(fields, rng.uniform(0.0, 1.0, len(fields)), strict=True))
    values["epoch"] = epoch
    values["count"] = 100.0
    values["nan_count"] = values["posinf_count"] = values["neginf_count"] = 0.0
    values["rms"] = 10.0 ** (VIEW_SCALE[view] - 0.7 * depth + 0.1 * np.sin(step + len(name)))
    if "bias" in name:
        values["rms"] = 0.0 if step == 0 else values["rms"] * 0.3  # zero-initialised bias
    values["dead_rate"] = (depth * 0.1 + step * 0.001) % 1.0
    values["activation_rate"] = 1.0 - values["dead_rate"] * 0.5
    values["spatial_dead_rate"] = np.nan  # dense layers: not applicable
    return np.array([values[f] for f in fields])


def _event(step: int, summary: summary_pb2.Summary, wall_time: float) -> event_pb2.Event:
    return event_pb2.Event(wall_time=wall_time, step=step, summary=summary)


def write_run(
    run_dir: str,
    steps: range | list[int],
    *,
    steps_per_epoch: int = 10,
    views: dict | None = None,
    metrics: tuple[str, ...] = ("loss",),
    epoch_bands: bool = True,
    written: Written | None = None,
    summaries: bool = False,
    summary_rows: dict[str, list[str]] | None = None,
    format_version: int = metadata.PROTO_VERSION,
) -> Written:
    """Write a synthetic run (all views of ``LAYOUT`` by default) into ``run_dir``.

    ``summaries``: also the view summaries of format 3, rows in ``LAYOUT`` order, or
    ``summary_rows[view]`` (tensor names; a name without a vector gets a NaN row).
    ``format_version``: the version the metadata states (2: as the last version-2 writer).
    """
    views = LAYOUT if views is None else views
    written = written or Written()
    writer = EventSink(run_dir)
    collected: dict[str, list] = {}
    metric_vals: dict[str, list] = {}
    for n, step in enumerate(steps):
        epoch = step // steps_per_epoch
        summary = summary_pb2.Summary()
        for view, tensors in views.items():
            vectors = {}
            for name, layer, depth in tensors:
                vec = stats_vector(view, name, depth, step, epoch)
                vectors[name] = vec
                one = summary_pb.tensor_stats_pb(
                    vec, view=view, name=name, layer=layer, depth=depth, shape=(4, 3)
                )
                summary.value.extend(one.value)
                tag = metadata.stats_tag(view, name)
                collected.setdefault(tag, []).append((step, vec))
                written.info[tag] = (view, layer, depth)
            if summaries:
                names = (summary_rows or {}).get(view) or [t[0] for t in tensors]
                width = len(slots.tensor_stats_fields(view))
                block = np.stack([vectors.get(name, np.full(width, np.nan)) for name in names])
                summary.value.extend(summary_pb.view_summary_pb(
                    view, [metadata.stats_tag(view, name) for name in names], block,
                    with_metadata=n == 0).value)
        for m in metrics:
            value = 2.0 / (1 + 0.05 * step) + 0.01 * np.cos(step)
            summary.value.extend(summary_pb.metric_pb(m, value, epoch).value)
            metric_vals.setdefault(m, []).append((step, epoch, value))
        _set_version(summary, format_version)
        writer.add_event(_event(step, summary, 1000.0 + step))
        last_of_epoch = (step + 1) % steps_per_epoch == 0
        if epoch_bands and last_of_epoch:
            for m in metrics:
                vals = [v for _, e, v in metric_vals[m] if e == epoch]
                band = summary_pb.metric_epoch_pb(m, vals, epoch)
                _set_version(band, format_version)
                writer.add_event(_event(step, band, 1000.0 + step))
    writer.close()
    for tag, points in collected.items():
        fields = slots.tensor_stats_fields(written.info[tag][0])
        old_steps, old = written.stats.get(tag, (np.empty(0, np.int64), {}))
        arr = np.array([v for _, v in points])
        new = {f: np.concatenate([old.get(f, np.empty(0)), arr[:, j]])
               for j, f in enumerate(fields)}
        written.stats[tag] = (np.concatenate([old_steps, [s for s, _ in points]]), new)
    for m, pts in metric_vals.items():
        a = np.array(pts)
        written.metrics[m] = (a[:, 0].astype(np.int64), a[:, 1], a[:, 2])
    return written


def _set_version(summary: summary_pb2.Summary, version: int) -> None:
    for value in summary.value:
        if value.metadata.plugin_data.content:
            data = metadata.parse_plugin_data(value.metadata.plugin_data.content)
            data.version = version
            value.metadata.plugin_data.content = data.SerializeToString()


def write_bad_tags(run_dir: str, steps: int = 5) -> None:
    """A run with a wrong-length tag, a newer-version tag and one good tag."""
    writer = EventSink(run_dir)
    good_meta = metadata.create_tensor_stats_metadata(view="output", name="good", depth=0)
    short_meta = metadata.create_tensor_stats_metadata(view="output", name="short", depth=1)
    data = plugin_data_pb2.PluginData()
    data.ParseFromString(good_meta.plugin_data.content)
    data.version = metadata.PROTO_VERSION + 1
    data.name = data.layer = "future"
    data.fields.append("future_field")
    future_meta = summary_pb2.SummaryMetadata()
    future_meta.CopyFrom(good_meta)
    future_meta.plugin_data.content = data.SerializeToString()
    width = len(slots.tensor_stats_fields("output"))
    for step in range(steps):
        s = summary_pb2.Summary()
        good = stats_vector("output", "good", 0, step, 0)
        s.value.add(tag="introspect/output/good", metadata=good_meta,
                    tensor=tensor_util.make_tensor_proto(good))
        s.value.add(tag="introspect/output/short", metadata=short_meta,
                    tensor=tensor_util.make_tensor_proto(np.zeros(width - 3)))
        s.value.add(tag="introspect/output/future", metadata=future_meta,
                    tensor=tensor_util.make_tensor_proto(np.append(good, 42.0 + step)))
        writer.add_event(_event(step, s, 1000.0 + step))
    writer.close()


# -- real TensorBoard processes ---------------------------------------------------


def served_port(proc: subprocess.Popen, log_path: str, deadline: float) -> int:
    """The port a ``tensorboard --port 0`` process bound, from the line it prints.

    Port 0 lets the kernel choose at bind time: a port picked free beforehand can be taken
    by another test's server in between (tests run in parallel workers), and then the
    checks would talk to that server.
    """
    while True:
        with open(log_path, errors="replace") as f:
            m = re.search(r"TensorBoard \S+ at http://[^:/]+:(\d+)", f.read())
        if m:
            return int(m.group(1))
        if proc.poll() is not None:
            raise RuntimeError(f"tensorboard exited early:\n{open(log_path).read()[-3000:]}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"tensorboard did not start:\n{open(log_path).read()[-3000:]}")
        time.sleep(0.2)


@dataclass
class TensorBoardProcess:
    """A running ``tensorboard``; ``url(route)`` is the plugin route's absolute URL."""

    proc: subprocess.Popen
    root: str  # http://host:port
    base: str  # root + path prefix
    log_path: str

    def url(self, route: str) -> str:
        return f"{self.base}/data/plugin/{metadata.PLUGIN_NAME}/{route.lstrip('./')}"

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()


#: ``tensorboard`` as on a viewing server without TensorFlow (``python -c`` this, then its
#: arguments): it proves the plugin needs none, and saves each process the 4-5 CPU-seconds
#: of importing it.
NO_TF_TENSORBOARD = (
    "import sys; sys.modules['tensorflow'] = None; "
    "from tensorboard.main import run_main; sys.argv[0] = 'tensorboard'; run_main()"
)


@contextlib.contextmanager
def tensorboard(
    *args: str, load_fast: str = "false", path_prefix: str = "", timeout: float = 90.0,
    tensorflow: bool = False,
):
    """Start ``tensorboard`` on a port of its own (args e.g. ``--logdir X``); yields it.
    ``tensorflow``: with TensorFlow importable, as on a training machine (its file system
    layer then reads the logdir), instead of without."""
    log = tempfile.NamedTemporaryFile("w", suffix=".log", delete=False)  # noqa: SIM115
    main = ["-m", "tensorboard.main"] if tensorflow else ["-c", NO_TF_TENSORBOARD]
    cmd = [sys.executable, *main, *args, "--host", "127.0.0.1",
           "--port", "0", f"--load_fast={load_fast}", "--reload_interval", "1"]
    if path_prefix:
        cmd += ["--path_prefix", path_prefix]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + timeout
    try:
        root = f"http://127.0.0.1:{served_port(proc, log.name, deadline)}"
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    tb = TensorBoardProcess(proc, root, root + path_prefix, log.name)
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"tensorboard exited early:\n{tb.log()}")
            try:
                urllib.request.urlopen(tb.base + "/data/plugins_listing", timeout=5).read()
                break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"tensorboard did not start:\n{tb.log()}") from None
                time.sleep(0.3)
        yield tb
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        os.unlink(log.name)


def fetch(
    url: str, *, gzip_ok: bool = False, keep_compressed: bool = False, timeout: float = 60.0
) -> tuple[int, dict, bytes]:
    """GET ``url``: (status, headers, body inflated if it was gzipped, unless kept)."""
    accept = "gzip" if gzip_ok else "identity"
    req = urllib.request.Request(url, headers={"Accept-Encoding": accept})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, headers, body = r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        status, headers, body = e.code, dict(e.headers), e.read()
    if headers.get("Content-Encoding") == "gzip" and not keep_compressed:
        body = gzip.decompress(body)
    return status, headers, body


def get_json(url: str, *, expect: int = 200, gzip_ok: bool = False, timeout: float = 60.0):
    """GET and parse JSON, asserting the status."""
    status, _, body = fetch(url, gzip_ok=gzip_ok, timeout=timeout)
    assert status == expect, f"{url}: {status} {body[:300]!r}"
    return json.loads(body)


def wait_for(predicate, timeout: float = 60.0, interval: float = 0.5):
    """Poll ``predicate()`` until it returns a truthy value; returns it."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(interval)


#: Where the plugin's routes live in TensorBoard's WSGI app.
PREFIX = "/data/plugin/introspect/"


class App:
    """A TensorBoard WSGI app with only this plugin, over a reloadable multiplexer."""

    def __init__(self, logdir: str) -> None:
        self.mux = plugin_event_multiplexer.EventMultiplexer(
            tensor_size_guidance={metadata.PLUGIN_NAME: 0}
        )
        self.mux.AddRunsFromDirectory(logdir)
        self.mux.Reload()
        dp = mux_provider.MultiplexerDataProvider(self.mux, logdir)
        self.plugin = introspect_plugin.IntrospectLoader().load(
            base_plugin.TBContext(data_provider=dp, logdir=logdir)
        )
        self.client = Client(application.TensorBoardWSGI([self.plugin], data_provider=dp))

    def get(self, route: str, *, status: int = 200, gzip_ok: bool = False):
        headers = {"Accept-Encoding": "gzip"} if gzip_ok else {}
        r = self.client.get(PREFIX + route, headers=headers)
        body = r.get_data()
        if r.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        assert r.status_code == status, (route, r.status_code, body[:300])
        return json.loads(body) if r.mimetype == "application/json" else body
