"""``./activity`` and the activity maps in ``./run``, over real event files (Python loader).

The maps are written with the numpy writer path (``summary_pb.activity_pb`` into a
``NumpyWriter``) from known arrays, so what the route serves is compared with what was
written, rounded as documented (docs/http_api.md).
"""

from __future__ import annotations

import numpy as np
import pytest
from tensorboard.compat.proto import summary_pb2
from tensorboard.util import tensor_util

from tb_introspect import metadata, slots, summary_pb
from tb_introspect.plugin import activity
from tb_introspect.writer import NumpyWriter
from tests.plugin.plugin_testlib import App, fetch, get_json, stats_vector, tensorboard, wait_for

STEPS_PER_EPOCH = 5
EPOCHS = 3
#: (name, layer, depth, static shape) of the layer outputs; out of depth order on purpose.
OUTPUTS = [
    ("dense", "dense", 2, (-1, 6)),
    ("conv", "conv", 0, (-1, 4, 3, 5)),
    ("seq", "seq", 1, (-1, 7, 2)),
]
#: Final dead rate of each output's statistics (the frontend's default layer: the highest).
DEAD = {"dense": 0.5, "conv": 0.2, "seq": 0.0}


def known_map(name: str, shape, epoch: int) -> tuple[np.ndarray, np.ndarray]:
    """Channel and position rates of ``name`` at ``epoch``: exact zeros, a tiny rate, NaN-free."""
    channels = shape[-1]
    positions = int(np.prod(shape[1:-1])) if len(shape) > 2 else 0
    c = (np.arange(channels) + 1.0 + epoch) / (channels + EPOCHS + 1)
    c[0] = 0.0  # a dead channel
    if channels > 2:
        c[1] = 3e-7  # active in one sample of millions: must not read as dead
    s = np.linspace(0.1, 0.9, positions) ** (1 + epoch) if positions else np.empty(0)
    if positions:
        s[-1] = 0.0  # a dead position (padding corner)
        s[0] = 1.0 - 1e-7  # active nearly always: must not read as "always"
    return c, s


def write_maps_run(run_dir, epochs=range(EPOCHS), broken: bool = False) -> None:
    """Per-step output statistics, a loss and, at each epoch's end, one map per output."""
    writer = NumpyWriter(run_dir)
    for epoch in epochs:
        for step in range(epoch * STEPS_PER_EPOCH + 1, (epoch + 1) * STEPS_PER_EPOCH + 1):
            summary = summary_pb2.Summary()
            for name, layer, depth, shape in OUTPUTS:
                vec = stats_vector("output", name, depth, step, epoch)
                vec[slots.tensor_stats_fields("output").index("dead_rate")] = DEAD[name]
                summary.value.extend(summary_pb.tensor_stats_pb(
                    vec, view="output", name=name, layer=layer, depth=depth, shape=shape).value)
            summary.value.extend(summary_pb.metric_pb("loss", 1.0 / step, epoch).value)
            writer.add_summary(summary, step, wall_time=1000.0 + step)
        summary = summary_pb2.Summary()
        for name, layer, depth, shape in OUTPUTS:
            c, s = known_map(name, shape, epoch)
            summary.value.extend(summary_pb.activity_pb(
                c, s, name=name, samples=32.0 * STEPS_PER_EPOCH, epoch=epoch, layer=layer,
                depth=depth, shape=shape).value)
        if broken:  # a map whose points do not match its layout
            meta = metadata.create_activity_metadata(name="broken", channels=4, positions=0,
                                                     depth=9)
            summary.value.add(tag=metadata.activity_tag("broken"), metadata=meta,
                              tensor=tensor_util.make_tensor_proto(np.zeros(3)))
        writer.add_summary(summary, step, wall_time=1000.0 + step)
    writer.close()


def write_stats_only_run(run_dir) -> None:
    """Output statistics without maps, as format version 1 or a writer that logs none."""
    writer = NumpyWriter(run_dir)
    for step in range(1, 4):
        writer.add_summary(summary_pb.tensor_stats_pb(
            stats_vector("output", "conv", 0, step, 0), view="output", name="conv",
            shape=(-1, 4, 3, 5)), step)
    writer.close()


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    root = tmp_path_factory.mktemp("activity")
    write_maps_run(root / "maps", broken=True)
    write_stats_only_run(root / "plain")
    return App(str(root))


class FakeClock:
    """Seconds that pass only when a test says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def tag(name: str) -> str:
    return metadata.activity_tag(name)


def test_maps_are_listed_by_run_but_never_as_views_or_metrics(app) -> None:
    listed = {r["run"]: r for r in app.get("runs")["runs"]}["maps"]
    assert listed["metrics"] == ["loss"]
    assert listed["views"] == {"variable": 0, "gradient": 0, "output": 3, "output_gradient": 0}
    doc = app.get("run?run=maps")
    listed_tags = [t["tag"] for v in doc["views"].values() for t in v]
    assert not [t for t in listed_tags if t.startswith("introspect/activity/")]
    assert [m["name"] for m in doc["metrics"]] == ["loss"]
    # Depth order, widths from the layout, spatial axes from the static shape.
    assert [(m["name"], m["channels"], m["positions"], m["spatial_shape"], m["final_dead_rate"])
            for m in doc["activity"]] == [
        ("conv", 5, 12, [4, 3], 0.2), ("seq", 2, 7, [7], 0.0), ("dense", 6, 0, [], 0.5),
        ("broken", 4, 0, [], None)]
    assert doc["activity"][0] == {
        "tag": tag("conv"), "name": "conv", "layer": "conv", "depth": 0, "shape": [-1, 4, 3, 5],
        "channels": 5, "positions": 12, "spatial_shape": [4, 3],
        "last_step": EPOCHS * STEPS_PER_EPOCH, "final_dead_rate": 0.2}
    assert {t["name"]: t["activity_tag"] for t in doc["views"]["output"]} == {
        "conv": tag("conv"), "seq": tag("seq"), "dense": tag("dense")}
    # Never read for ./run: the broken map is not even found unreadable there.
    assert doc["skipped"] == []
    assert "activity" not in str(app.get("overview?run=maps")["views"]["output"]["tensors"])


def test_the_sampled_read_behind_run_and_overview_leaves_maps_out(app) -> None:
    app.get("run?run=maps")
    held = [v[1] for v in app.plugin._sampled._entries.values()]
    assert held, "./run read no sample"
    for sample in held:
        assert sample.rs.activity == {}
        assert not [t for t in sample.rs.all_series() if t.startswith("introspect/activity/")]


@pytest.mark.parametrize("name", [n for n, *_ in OUTPUTS])
def test_activity_serves_every_epoch_as_written(app, name) -> None:
    _, layer, depth, shape = next(o for o in OUTPUTS if o[0] == name)
    doc = app.get(f"activity?run=maps&tag={tag(name)}")
    assert {k: doc[k] for k in ("run", "tag", "name", "layer", "depth", "shape", "sampled")} == {
        "run": "maps", "tag": tag(name), "name": name, "layer": layer, "depth": depth,
        "shape": list(shape), "sampled": False}
    assert doc["version"] == metadata.PROTO_VERSION
    assert doc["epochs"] == list(range(EPOCHS))
    assert doc["steps"] == [(e + 1) * STEPS_PER_EPOCH for e in range(EPOCHS)]
    assert doc["samples"] == [160.0] * EPOCHS
    assert len(doc["channel_rates"]) == len(doc["spatial_rates"]) == EPOCHS
    for epoch in range(EPOCHS):
        c, s = known_map(name, shape, epoch)
        got_c, got_s = np.array(doc["channel_rates"][epoch]), np.array(doc["spatial_rates"][epoch])
        assert got_c.shape == c.shape and got_s.shape == s.shape
        np.testing.assert_allclose(got_c, c, atol=0.5 * 10 ** -activity.RATE_DECIMALS + 1e-12)
        np.testing.assert_allclose(got_s, s, atol=0.5 * 10 ** -activity.RATE_DECIMALS + 1e-12)
        # Exactly zero stays zero (dead); a tiny rate stays above it, a near-1 rate below 1.
        assert (got_c == 0).tolist() == (c == 0).tolist()
        assert (got_s == 0).tolist() == (s == 0).tolist()
        assert (got_s == 1).tolist() == (s == 1).tolist()


def test_activity_of_a_sequence_and_a_dense_output(app) -> None:
    seq = app.get(f"activity?run=maps&tag={tag('seq')}")
    assert (seq["channels"], seq["positions"], seq["spatial_shape"]) == (2, 7, [7])
    dense = app.get(f"activity?run=maps&tag={tag('dense')}")
    assert (dense["positions"], dense["spatial_shape"]) == (0, [])
    assert dense["spatial_rates"] == [[]] * EPOCHS


def test_a_run_without_maps(app) -> None:
    doc = app.get("run?run=plain")
    assert doc["activity"] == [] and doc["views"]["output"][0]["activity_tag"] is None


@pytest.mark.parametrize(
    ("route", "status", "message"),
    [
        ("activity", 400, "missing query parameter 'run'"),
        ("activity?run=maps", 400, "missing query parameter 'tag'"),
        ("activity?run=maps&tag=", 400, "missing query parameter 'tag'"),
        (f"activity?run=maps&tag={tag('conv')}&tag={tag('seq')}", 400, "given 2 times"),
        ("activity?run=maps&tag=introspect/output/conv", 400, "is not an activity map"),
        ("activity?run=maps&tag=introspect/metric/loss", 400, "is not an activity map"),
        (f"activity?run=nope&tag={tag('conv')}", 404, "run 'nope' not found"),
        (f"activity?run=maps&tag={tag('nope')}", 404, "no readable activity map"),
        (f"activity?run=plain&tag={tag('conv')}", 404, "no readable activity map"),
        (f"activity?run=maps&tag={tag('broken')}", 404, "has 3 values, layout has 6 fields"),
        (f"series?run=maps&tag={tag('conv')}", 400, "is an activity map; read it with ./activity"),
    ],
)
def test_bad_requests_get_a_clear_4xx(app, route, status, message) -> None:
    assert message in app.get(route, status=status)["error"]


def test_gzip_and_new_epochs(tmp_path) -> None:
    write_maps_run(tmp_path / "live", epochs=range(2))
    app = App(str(tmp_path))
    clock = FakeClock()
    app.plugin.clock = clock
    route = f"activity?run=live&tag={tag('conv')}"
    zipped = app.client.get("/data/plugin/introspect/" + route,
                            headers={"Accept-Encoding": "gzip"})
    assert zipped.headers["Content-Encoding"] == "gzip"
    assert app.get(route)["epochs"] == [0, 1]
    write_maps_run(tmp_path / "live", epochs=range(2, 3))
    app.mux.Reload()
    assert app.get(route)["epochs"] == [0, 1]  # the run's listing is reused for listing_ttl_s
    clock.now += app.plugin.listing_ttl_s
    doc = app.get(route)
    assert doc["epochs"] == [0, 1, 2]
    np.testing.assert_allclose(doc["channel_rates"][2], known_map("conv", OUTPUTS[1][3], 2)[0],
                               atol=1e-4)


@pytest.mark.parametrize("load_fast", ["false", "true"])
def test_both_loaders_of_a_real_tensorboard_serve_the_same_maps(app, tmp_path, load_fast) -> None:
    """A real ``tensorboard`` process, Python loader and Rust data server, against the WSGI app."""
    write_maps_run(tmp_path / "maps")
    url = f"activity?run=maps&tag={tag('conv')}"
    with tensorboard("--logdir", str(tmp_path), load_fast=load_fast) as tb:
        # The loader reads the logdir after it starts: 404 until the run is in.
        wait_for(lambda: fetch(tb.url("run?run=maps"))[0] == 200, timeout=90)
        listed = get_json(tb.url("run?run=maps"))["activity"]
        doc = get_json(tb.url(url), gzip_ok=True)
        assert get_json(tb.url(f"activity?run=maps&tag={tag('nope')}"), expect=404)["error"]
    assert listed == [m for m in app.get("run?run=maps")["activity"] if m["name"] != "broken"]
    assert doc == app.get(url)
