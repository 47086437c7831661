"""Bounded load test of the Introspect plugin through real TensorBoard processes.

Writes the 200-tensor benchmark run (``plugin_bench.write_bench_run``: N
tensors x 4 views x S steps), starts ``tensorboard`` (without TensorFlow, as
on a viewing server) with each loader on loopback, waits until every point is
loaded, then lets C concurrent clients each send R requests (a fixed mix over
the listing, run contents, overview and series routes, series tags drawn at
random with a fixed seed). Every answer is checked (status 200, JSON, the
expected runs/tags/number of points); anything else counts as an error.
Prints p50/p99/max latency per route as a Markdown table.

    python benchmarks/load_test.py                       # 200 tensors x 1,000 steps, 32 x 25
    python benchmarks/load_test.py --steps 100 --requests 10 --loaders true
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import json
import os
import random
import shutil
import sys
import tempfile
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))  # the tests package: its process helpers
sys.path.insert(0, HERE)

from plugin_bench import write_bench_run  # noqa: E402

from tb_introspect import metadata, slots  # noqa: E402
from tests.reliability.reliability_testlib import serve  # noqa: E402

#: One client's requests cycle through these routes in order.
ROUTES = ("runs", "run", "overview", "series", "series x8 rms")


@dataclass
class LoadResult:
    """Latencies (ms) per route, errors (route, message), wall time of the whole load."""

    latencies: dict[str, list[float]] = field(default_factory=lambda: {r: [] for r in ROUTES})
    errors: list[tuple[str, str]] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def requests(self) -> int:
        return sum(len(v) for v in self.latencies.values()) + len(self.errors)

    def percentiles(self, route: str | None = None) -> tuple[float, float, float]:
        """(p50, p99, max) in ms of one route, or of all requests."""
        values = self.latencies[route] if route else [
            v for vs in self.latencies.values() for v in vs]
        if not values:
            return (float("nan"),) * 3
        a = np.asarray(values)
        return float(np.percentile(a, 50)), float(np.percentile(a, 99)), float(a.max())


def _get(host: str, port: int, path: str, timeout: float) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", path, headers={"Accept-Encoding": "gzip"})
        response = conn.getresponse()
        body = response.read()
        if response.getheader("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        return response.status, body
    finally:
        conn.close()


def _check(route: str, doc: dict, run: str, tags: list[str], want_tags: list[str],
           steps: int) -> None:
    """Raise AssertionError unless ``doc`` is the full, right answer."""
    if route == "runs":
        assert [r["run"] for r in doc["runs"]] == [run], doc["runs"]
        assert sum(doc["runs"][0]["views"].values()) == len(tags)
    elif route == "run":
        listed = [t for v in doc["views"].values() for t in v]
        assert len(listed) == len(tags) and all(complete(t, steps) for t in listed)
    elif route == "overview":
        # The Overview draws the run's sample (bounded reads): at most every step, and
        # always the last one.
        assert set(doc["views"]) == set(slots.VIEWS)
        for view in doc["views"].values():
            assert 0 < len(view["steps"]) <= steps and view["steps"][-1] == steps - 1
            assert len(view["tensors"]) == len(tags) // 4
    else:
        assert sorted(doc["series"]) == sorted(want_tags), sorted(doc["series"])
        for s in doc["series"].values():
            assert len(s["steps"]) == steps
            if route == "series x8 rms":
                assert list(s["values"]) == ["rms"]


def run_load(plugin_url: str, run: str, tags: list[str], steps: int, *, clients: int = 32,
             requests_per_client: int = 25, seed: int = 0, timeout: float = 120.0
             ) -> LoadResult:
    """Send ``clients x requests_per_client`` requests, ``clients`` at a time; check each.

    ``plugin_url`` is ``http://127.0.0.1:PORT[/prefix]/data/plugin/introspect/``.
    """
    u = urllib.parse.urlsplit(plugin_url)
    host, port, base = u.hostname, u.port, u.path.rstrip("/") + "/"
    result = LoadResult()
    lock = threading.Lock()
    start = threading.Barrier(clients)
    q = urllib.parse.quote

    def client(index: int) -> None:
        rng = random.Random(seed * 1000 + index)
        start.wait()
        for k in range(requests_per_client):
            route = ROUTES[(index + k) % len(ROUTES)]
            want: list[str] = []
            if route == "runs":
                path = "runs"
            elif route == "run":
                path = f"run?run={q(run, safe='')}"
            elif route == "overview":
                path = f"overview?run={q(run, safe='')}"
            else:
                want = rng.sample(tags, 1 if route == "series" else 8)
                path = f"series?run={q(run, safe='')}" + "".join(
                    f"&tag={q(t, safe='')}" for t in want)
                if route != "series":
                    path += "&field=rms"
            t0 = time.perf_counter()
            try:
                status, body = _get(host, port, base + path, timeout)
                elapsed = (time.perf_counter() - t0) * 1000
                assert status == 200, f"status {status}: {body[:200]!r}"
                _check(route, json.loads(body), run, tags, want, steps)
            except Exception as e:  # every failure is counted, none stops the load
                with lock:
                    result.errors.append((route, f"{type(e).__name__}: {e}"[:300]))
                continue
            with lock:
                result.latencies[route].append(elapsed)

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout * requests_per_client
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    result.wall_s = time.perf_counter() - t0
    missing = clients * requests_per_client - result.requests
    if missing:  # a client still stuck at the deadline
        result.errors.append(("all", f"{missing} requests did not finish in time"))
    return result


def bench_tags(tensors: int) -> list[str]:
    """The statistics tags of ``write_bench_run``'s run."""
    return [metadata.stats_tag(view, f"layer_{i:03d}/kernel")
            for view in slots.VIEWS for i in range(tensors)]


def complete(entry: dict, steps: int) -> bool:
    """Whether a tag of ``./run`` holds all ``steps`` points (steps 0 … steps - 1).

    ``num_points`` is null for a tag above the run's sample (bounded reads: counting would
    mean reading every point); its exact ``last_step`` then says the last point is in.
    """
    return entry["last_step"] == steps - 1 and entry["num_points"] in (steps, None)


def wait_loaded(tb, run: str, tags: int, steps: int, timeout: float, poll: float = 1.0) -> float:
    """Seconds until the plugin lists ``tags`` tags of ``run`` with all ``steps`` points."""
    t0 = time.monotonic()
    while True:
        url = urllib.parse.urlsplit(tb.plugin_url(f"run?run={urllib.parse.quote(run)}"))
        try:
            status, body = _get(url.hostname, url.port, f"{url.path}?{url.query}", 60)
            if status == 200:
                doc = json.loads(body)
                listed = [t for v in doc["views"].values() for t in v]
                if len(listed) == tags and all(complete(t, steps) for t in listed):
                    return time.monotonic() - t0
        except OSError:
            pass
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"run {run!r} not fully loaded after {timeout:.0f} s")
        time.sleep(poll)


def load_against(logdir: Path, load_fast: str, tensors: int, steps: int, clients: int,
                 requests: int, seed: int = 0, load_timeout: float = 1800,
                 poll: float = 1.0) -> LoadResult:
    """Start TensorBoard with one loader over ``logdir`` (run ``bench``) and run the load."""
    tags = bench_tags(tensors)
    with serve(logdir, load_fast) as tb:
        loaded = wait_loaded(tb, "bench", len(tags), steps, load_timeout, poll)
        print(f"[load_fast={load_fast}] run loaded {loaded:.1f} s after TensorBoard started",
              file=sys.stderr)
        result = run_load(tb.plugin_url(""), "bench", tags, steps, clients=clients,
                          requests_per_client=requests, seed=seed)
        if tb.process.poll() is not None:
            result.errors.append(("all", "tensorboard exited"))
    return result


def table(rows: list[tuple[str, LoadResult]]) -> str:
    lines = ["| loader | route | requests | errors | p50 (ms) | p99 (ms) | max (ms) |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for load_fast, r in rows:
        loader = "Rust" if load_fast == "true" else "Python"
        for route in (*ROUTES, None):
            p50, p99, top = r.percentiles(route)
            n = len(r.latencies[route]) if route else r.requests
            errors = sum(e[0] == route for e in r.errors) if route else len(r.errors)
            label = route or f"**all** ({r.requests / r.wall_s:.1f} req/s)"
            lines.append(f"| {loader} | {label} | {n} | {errors} | {p50:.0f} | {p99:.0f} |"
                         f" {top:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tensors", type=int, default=200, help="monitored tensors per view")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--requests", type=int, default=25, help="requests per client")
    parser.add_argument("--loaders", default="false,true", help="--load_fast values to test")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--logdir", help="reuse/keep this logdir (default: a temporary one)")
    parser.add_argument("--poll", type=float, default=1.0,
                        help="seconds between checks while TensorBoard loads the run")
    args = parser.parse_args(argv)

    logdir = Path(args.logdir or tempfile.mkdtemp(prefix="introspect-load-"))
    rows = []
    try:
        if not (logdir / "bench").is_dir():
            t = time.perf_counter()
            points = write_bench_run(str(logdir / "bench"), args.tensors, args.steps)
            print(f"wrote {points:,} points in {time.perf_counter() - t:.1f} s", file=sys.stderr)
        for load_fast in args.loaders.split(","):
            r = load_against(logdir, load_fast, args.tensors, args.steps, args.clients,
                             args.requests, args.seed, poll=args.poll)
            rows.append((load_fast, r))
            for route, message in r.errors[:10]:
                print(f"  error [{route}]: {message}", file=sys.stderr)
    finally:
        if not args.logdir:
            shutil.rmtree(logdir, ignore_errors=True)
    print(f"\n{args.tensors} tensors x 4 views x {args.steps} steps; {args.clients} concurrent"
          f" clients x {args.requests} requests each over loopback, cycling {', '.join(ROUTES)}\n")
    print(table(rows))
    return 1 if any(r.errors for _, r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
