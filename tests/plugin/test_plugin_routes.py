"""The plugin's routes in a TensorBoard WSGI app over real event files (Python loader)."""

from __future__ import annotations

import gzip
import math
import os

import numpy as np
import pytest
from tensorboard.compat.proto import event_pb2
from tensorboard.plugins import base_plugin
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from tb_introspect import diagnose, metadata, slots, summary_pb
from tb_introspect.plugin import assets, introspect_plugin
from tests.plugin.plugin_testlib import PREFIX, App, Written, write_bad_tags, write_run

VARIABLE_ORDER = ["dense/bias", "dense/kernel", "dense_1/kernel", "out/kernel"]
# Each layer's largest tensor; the fixture's tensors all have 100 elements, and on a tie
# the first in depth and name order is kept.
STACK_ORDER = ["dense/bias", "dense_1/kernel", "out/kernel"]


def write_nonfinite_run(run_dir: str) -> None:
    """Two output tensors; 'blowup' has NaN/Inf slots from step 2 on."""
    writer = EventFileWriter(run_dir)
    fields = slots.tensor_stats_fields("output")
    for step in range(4):
        summary = None
        for depth, name in enumerate(("calm", "blowup")):
            v = dict.fromkeys(fields, 0.5)
            v["epoch"], v["rms"] = 0, 0.1 * (depth + 1)
            v["nan_count"] = v["posinf_count"] = v["neginf_count"] = 0.0
            if name == "blowup" and step >= 2:
                v["rms"], v["max"], v["min"], v["nan_count"], v["posinf_count"] = (
                    np.nan, np.inf, -np.inf, 3.0, 1.0)
            s = summary_pb.tensor_stats_pb([v[f] for f in fields], view="output", name=name,
                                           depth=depth)
            if summary is None:
                summary = s
            else:
                summary.value.extend(s.value)
        writer.add_event(event_pb2.Event(step=step, wall_time=1.0 + step, summary=summary))
    writer.close()


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("routes")
    written = write_run(str(root / "exp" / "a"), range(40), steps_per_epoch=10)
    write_run(str(root / "exp" / "b" / "deep"), range(5), metrics=("loss", "acc"),
              epoch_bands=False, views={"output": [("only", "only", 0)]})
    write_bad_tags(str(root / "bad"))
    write_nonfinite_run(str(root / "nan"))
    return str(root), written, App(str(root))


def test_runs_lists_nested_runs_without_reading_points(env) -> None:
    _, _, app = env
    doc = app.get("runs")
    assert doc["reader_version"] == metadata.PROTO_VERSION
    by_run = {r["run"]: r for r in doc["runs"]}
    assert list(by_run) == ["bad", "exp/a", "exp/b/deep", "nan"]
    assert by_run["exp/a"]["views"] == {"variable": 4, "gradient": 4, "output": 3,
                                        "output_gradient": 2}
    assert by_run["exp/b/deep"]["views"]["variable"] == 0
    assert by_run["exp/b/deep"]["metrics"] == ["acc", "loss"]
    assert by_run["exp/a"]["max_step"] == 39
    assert by_run["bad"]["format_version"] == metadata.PROTO_VERSION + 1


def test_run_lists_views_in_depth_order(env) -> None:
    _, written, app = env
    doc = app.get("run?run=exp/a")
    assert list(doc["views"]) == list(slots.VIEWS)
    var = doc["views"]["variable"]
    assert [t["name"] for t in var] == VARIABLE_ORDER
    t = var[2]
    assert t == {
        "tag": "introspect/variable/dense_1/kernel", "name": "dense_1/kernel",
        "layer": "dense_1", "depth": 1, "shape": [4, 3], "dtype": "float32",
        "cadence": "step", "fields": list(slots.tensor_stats_fields("variable")),
        "quantiles": list(slots.DEFAULT_QUANTILES), "num_points": 40,
        "first_step": 0, "last_step": 39, "first_epoch": 0, "last_epoch": 3,
    }
    assert doc["metrics"] == [{
        "name": "loss", "tag": "introspect/metric/loss",
        "epoch_tag": "introspect/metric_epoch/loss", "num_points": 40,
        "first_step": 0, "last_step": 39, "num_epochs": 4,
    }]
    assert doc["skipped"] == []
    bad = app.get("run?run=bad")
    assert [s["tag"] for s in bad["skipped"]] == ["introspect/output/short"]
    assert [t["name"] for t in bad["views"]["output"]] == ["future", "good"]


def test_series_is_columnar_and_matches_what_was_written(env) -> None:
    _, written, app = env
    tag, loss = "introspect/gradient/dense/kernel", "introspect/metric/loss"
    doc = app.get(f"series?run=exp/a&tag={tag}&tag={loss}&tag=introspect/metric_epoch/loss")
    s = doc["series"][tag]
    steps, values = written.stats[tag]
    assert s["steps"] == steps.tolist() and s["epochs"] == values["epoch"].astype(int).tolist()
    assert s["kind"] == "tensor_stats" and s["view"] == "gradient" and s["depth"] == 0
    assert set(s["values"]) == set(slots.tensor_stats_fields("gradient")) - {"epoch"}
    assert s["values"]["q87.5"] == values["q87.5"].tolist()
    assert s["values"]["cos_prev"] == values["cos_prev"].tolist()
    # spatial_dead_rate was written as NaN: JSON null, never the token NaN.
    assert s["values"]["spatial_dead_rate"] == [None] * 40
    assert doc["series"][loss]["values"]["value"] == written.metrics["loss"][2].tolist()
    band = doc["series"]["introspect/metric_epoch/loss"]
    assert band["kind"] == "metric_epoch" and band["steps"] == [9, 19, 29, 39]
    assert set(band["values"]) == {"min", "p25", "p50", "p75", "max", "mean", "count"}
    narrowed = app.get(f"series?run=exp/a&tag={tag}&tag={loss}&field=rms&field=value")
    assert set(narrowed["series"][tag]["values"]) == {"rms"}
    assert set(narrowed["series"][loss]["values"]) == {"value"}
    few = app.get(f"series?run=exp/a&tag={tag}&downsample=5")["series"][tag]
    assert len(few["steps"]) == 5 and few["steps"][-1] == 39
    assert len(app.get(f"series?run=exp/a&tag={tag}&downsample=0")["series"][tag]["steps"]) == 40


def test_series_of_unreadable_and_newer_tags(env) -> None:
    _, _, app = env
    doc = app.get("series?run=bad&tag=introspect/output/future&tag=introspect/output/short")
    assert list(doc["series"]) == ["introspect/output/future"]
    assert doc["series"]["introspect/output/future"]["values"]["future_field"] == [
        42.0, 43.0, 44.0, 45.0, 46.0]
    assert doc["skipped"][0]["tag"] == "introspect/output/short"


def test_nonfinite_values_are_null_and_counted(env) -> None:
    _, _, app = env
    s = app.get("series?run=nan&tag=introspect/output/blowup")["series"][
        "introspect/output/blowup"]["values"]
    assert s["rms"] == [0.2, 0.2, None, None]
    assert s["max"][2:] == [None, None] and s["min"][2:] == [None, None]
    assert s["nan_count"] == [0.0, 0.0, 3.0, 3.0] and s["posinf_count"][2] == 1.0
    out = app.get("overview?run=nan")["views"]["output"]
    assert out["nonfinite"] == [0, 0, 4, 4]
    assert out["first_nonfinite"] == {"tag": "introspect/output/blowup", "step": 2}
    assert out["stack"][1][2:] == [0.0, 0.0] and out["stack"][0][2:] == [1.0, 1.0]
    assert out["log10_rms"][1][2] is None


@pytest.mark.parametrize(
    ("route", "status", "message"),
    [
        ("run", 400, "missing query parameter 'run'"),
        ("run?run=", 400, "missing query parameter 'run'"),
        ("run?run=a&run=b", 400, "given 2 times"),
        ("run?run=nope", 404, "run 'nope' not found"),
        ("overview?run=nope", 404, "run 'nope' not found"),
        ("overview?run=exp/a&max_points=-3", 400, "must be >= 0"),
        ("overview?run=exp/a&max_points=x", 400, "must be an integer"),
        ("series?run=exp/a", 400, "missing query parameter 'tag'"),
        ("series?tag=introspect/metric/loss", 400, "missing query parameter 'run'"),
        ("series?run=nope&tag=introspect/metric/loss", 404, "run 'nope' not found"),
        ("series?run=exp/a&tag=introspect/metric/loss&tag=nope&tag=no2", 404,
         "no tb-introspect tag 'nope' (and 1 more)"),
        ("series?run=exp/a&tag=introspect/metric/loss&field=bogus", 400, "field 'bogus'"),
        ("series?run=exp/a&tag=introspect/metric/loss&downsample=1.5", 400, "integer"),
        ("static/../introspect_plugin.py", 404, "no static file"),
        ("static/..%2F..%2Fmetadata.py", 404, "no static file"),
        ("static/%2e%2e/%2e%2e/metadata.py", 404, "no static file"),
        ("static//etc/passwd", 404, "no static file"),
        ("static/nope.js", 404, "no static file"),
    ],
)
def test_bad_input_gets_a_clear_4xx(env, route, status, message) -> None:
    _, _, app = env
    doc = app.get(route, status=status)
    assert message in doc["error"]


def test_static_files_and_index(env, tmp_path) -> None:
    _, _, app = env
    r = app.client.get(PREFIX + "index.js")
    assert r.status_code == 200 and r.mimetype == "text/javascript"
    assert b"render" in r.get_data()
    assert r.headers["X-Content-Type-Options"] == "nosniff"
    # A file of the real static folder, by its relative name.
    name = sorted(os.listdir(assets.STATIC_DIR))[0]
    r = app.client.get(PREFIX + "static/" + name)
    assert r.status_code == 200
    with open(os.path.join(assets.STATIC_DIR, name), "rb") as f:
        assert r.get_data() == f.read()
    # A symlink leading out of the folder is refused; the stub stands in for a missing bundle.
    (tmp_path / "secret.txt").write_text("secret")
    static = tmp_path / "static"
    static.mkdir()
    (static / "link.txt").symlink_to(tmp_path / "secret.txt")
    (static / "ok.css").write_text("body{}")
    assert assets.resolve("ok.css", str(static)).endswith("ok.css")
    with pytest.raises(Exception, match="no static file"):
        assets.resolve("link.txt", str(static))
    from werkzeug.test import EnvironBuilder
    from werkzeug.wrappers import Request

    request = Request(EnvironBuilder().get_environ())
    stub = assets.respond_index(request, str(static))
    assert b"bundle is missing" in stub.get_data()


def test_gzip_when_accepted(env) -> None:
    _, _, app = env
    loss = "series?run=exp/a&tag=introspect/metric/loss"
    for route in ("overview?run=exp/a", "run?run=exp/a", loss):
        zipped = app.client.get(PREFIX + route, headers={"Accept-Encoding": "gzip, deflate"})
        plain = app.client.get(PREFIX + route, headers={"Accept-Encoding": "identity"})
        assert zipped.headers["Content-Encoding"] == "gzip"
        assert "Content-Encoding" not in plain.headers
        assert gzip.decompress(zipped.get_data()) == plain.get_data()


def reference_overview_column(written: Written, view: str, order: list[str], step: int):
    tags = [metadata.stats_tag(view, n) for n in order]
    rms = [written.stats[t][1]["rms"][written.stats[t][0].tolist().index(step)] for t in tags]
    dead = [written.stats[t][1]["dead_rate"][written.stats[t][0].tolist().index(step)]
            for t in tags]
    return rms, dead


def test_overview_matches_reference(env) -> None:
    _, written, app = env
    doc = app.get("overview?run=exp/a")
    assert list(doc["views"]) == list(slots.VIEWS)
    var = doc["views"]["variable"]
    assert [t["name"] for t in var["tensors"]] == VARIABLE_ORDER
    assert var["steps"] == list(range(40)) and var["epochs"][-1] == 3
    for step in (0, 17, 39):
        rms, dead = reference_overview_column(written, "variable", VARIABLE_ORDER, step)
        got = [row[step] for row in var["rms_bands"]]
        np.testing.assert_allclose(got, np.percentile(rms, var["rms_quantiles"]))
        logs = [math.log10(r) if r > 0 else None for r in rms]
        # The stack has one band per layer (its largest tensor), natural log, smallest = 1.
        per_layer = [rms[VARIABLE_ORDER.index(n)] for n in STACK_ORDER]
        ln = [math.log(r) for r in per_layer if r > 0]
        shifted = [math.log(r) - min(ln) + 1 if r > 0 else 0.0 for r in per_layer]
        expected = [x / sum(shifted) for x in shifted]
        np.testing.assert_allclose([row[step] for row in var["stack"]], expected, atol=1e-5)
        for i, v in enumerate(logs):
            got_log = var["log10_rms"][i][step]
            assert (got_log is None) if v is None else got_log == pytest.approx(v, abs=1e-4)
        act = var["activity"]["dead_rate"]
        assert act["max"][step] == max(dead) and act["min"][step] == min(dead)
        assert act["mean"][step] == pytest.approx(sum(dead) / len(dead))
        assert act["worst"][step] == dead.index(max(dead))
    # step 0: the zero-initialised bias has RMS 0 -> no log, stack share 0
    assert var["stack"][0][0] == 0.0 and var["log10_rms"][0][0] is None
    assert [b["tag"] for b in var["stack_layers"]] == [
        metadata.stats_tag("variable", n) for n in STACK_ORDER]
    assert [var["tensors"][b["tensor"]]["name"] for b in var["stack_layers"]] == STACK_ORDER
    assert var["activity"]["spatial_dead_rate"]["max"] == [None] * 40
    assert var["nonfinite"] == [0] * 40 and var["first_nonfinite"] is None
    loss = doc["metrics"]["loss"]
    assert loss["values"] == written.metrics["loss"][2].tolist()
    band = loss["epoch_band"]
    assert band["source"] == "logged" and band["epochs"] == [0, 1, 2, 3]
    epoch1 = written.metrics["loss"][2][10:20]
    assert band["p50"][1] == pytest.approx(np.median(epoch1))
    # The real rules (tb_introspect.diagnose) ran on the run without failing.
    assert isinstance(doc["findings"], list) and "findings_error" not in doc
    # no logged band: computed from the per-step values
    deep = app.get("overview?run=exp/b/deep")
    computed = deep["metrics"]["acc"]["epoch_band"]
    assert computed["source"] == "computed" and computed["count"] == [5]
    assert computed["max"] == [max(deep["metrics"]["acc"]["values"])]
    strided = app.get("overview?run=exp/a&max_points=10")["views"]["gradient"]
    assert len(strided["steps"]) == 10 and strided["steps"][0] == 0
    assert strided["steps"][-1] == 39 and len(strided["stack"][0]) == 10


class FakeClock:
    """Seconds that pass only when a test says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_overview_follows_new_points(env) -> None:
    root, _, _ = env
    # An app of its own: every listing it holds was stored on the fake clock.
    app = App(root)
    clock = FakeClock()
    app.plugin.clock = clock
    run_dir = os.path.join(root, "exp", "b", "deep")
    before = app.get("overview?run=exp/b/deep")["views"]["output"]["steps"]
    assert before == list(range(5))
    write_run(run_dir, range(5, 8), metrics=("loss", "acc"), epoch_bands=False,
              views={"output": [("only", "only", 0)]})
    assert app.get("overview?run=exp/b/deep")["views"]["output"]["steps"] == before  # not reloaded
    app.mux.Reload()
    # The run's tag listing is reused for listing_ttl_s (it spares a provider round trip)...
    clock.now += app.plugin.listing_ttl_s / 2
    assert app.get("overview?run=exp/b/deep")["views"]["output"]["steps"] == before
    # ...and listed again once that has passed.
    clock.now += app.plugin.listing_ttl_s
    assert app.get("overview?run=exp/b/deep")["views"]["output"]["steps"] == list(range(8))
    assert app.get("run?run=exp/b/deep")["views"]["output"][0]["num_points"] == 8


def test_findings_hook(env, monkeypatch) -> None:
    root, _, _ = env
    seen = []

    def find_issues(run_series):
        seen.append(run_series)
        layer = run_series.tensors["output"][0].info.layer
        # numpy numbers and NaN, as rules computing evidence with numpy return them
        return [diagnose.Finding(kind="dead_units", severity="warning", title="t",
                                 layers=(layer,),
                                 evidence={"dead_rate": np.float32(0.5), "ratio": float("nan"),
                                           "steps": np.arange(2)})]

    monkeypatch.setattr(diagnose, "find_issues", find_issues)
    app = App(root)  # fresh caches
    doc = app.get("overview?run=exp/a")
    assert [{k: f[k] for k in ("kind", "layers", "evidence")} for f in doc["findings"]] == [
        {"kind": "dead_units", "layers": ["dense"], "evidence": {
            "dead_rate": 0.5, "ratio": None, "steps": [0, 1]}}]
    assert seen[0].run == "exp/a" and "findings_error" not in doc

    def broken(run_series):
        raise RuntimeError("rule exploded")

    monkeypatch.setattr(diagnose, "find_issues", broken)
    doc = App(root).get("overview?run=exp/a")
    assert doc["findings"] == [] and "rule exploded" in doc["findings_error"]
    assert doc["views"]["output"]["steps"]


def test_loader_defaults_samples_but_keeps_users_value() -> None:
    import argparse

    loader = introspect_plugin.IntrospectLoader()
    flags = argparse.Namespace(samples_per_plugin={"images": 3})
    loader.fix_flags(flags)
    assert flags.samples_per_plugin == {"images": 3, "introspect": 0}
    flags = argparse.Namespace(samples_per_plugin={"introspect": 50})
    loader.fix_flags(flags)
    assert flags.samples_per_plugin == {"introspect": 50}
    flags = argparse.Namespace(samples_per_plugin="scalars=10, introspect=7")
    loader.fix_flags(flags)
    assert flags.samples_per_plugin == {"scalars": 10, "introspect": 7}
    plugin = loader.load(base_plugin.TBContext(data_provider=None))
    assert plugin.frontend_metadata().es_module_path == "/index.js"
    assert plugin.frontend_metadata().tab_name == "Introspect"
    assert set(plugin.get_plugin_apps()) == {"/runs", "/run", "/series", "/export", "/overview",
                                             "/findings", "/activity", "/probes", "/index.js",
                                             "/static/*"}


def test_series_from_the_cached_full_read_equals_a_provider_read(env) -> None:
    root, written, _ = env
    app = App(root)  # fresh caches
    tag = "introspect/output/dense_1"
    tags = f"tag={tag}&tag=introspect/metric/loss"
    before = app.get(f"series?run=exp/a&{tags}")
    app.get("overview?run=exp/a")  # the full read that later series requests reuse
    after = app.get(f"series?run=exp/a&{tags}&field=rms&field=value")
    assert after["series"][tag]["values"]["rms"] == before["series"][tag]["values"]["rms"]
    assert after["series"][tag]["steps"] == written.stats[tag][0].tolist()
    few = app.get(f"series?run=exp/a&tag={tag}&downsample=7")["series"][tag]
    assert len(few["steps"]) == 7 and few["steps"][0] == 0 and few["steps"][-1] == 39
    assert set(few["steps"]) <= set(before["series"][tag]["steps"])
