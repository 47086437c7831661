"""The plugin inside real ``tensorboard`` processes: both loaders, path prefix, live runs."""

from __future__ import annotations

import json
from urllib.parse import quote

import pytest
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter
from tensorboard.util import tensor_util

from tb_introspect import metadata
from tests.plugin.plugin_testlib import fetch, get_json, tensorboard, wait_for, write_run

STEPS = 150  # above both loaders' default reservoirs (10 Python, 100 Rust)
ONE = {"output": [("only", "only", 0)]}


@pytest.fixture(
    scope="module",
    params=[("false", "/proxy/tb"), ("true", "/x/y")],
    ids=["python-loader", "rust-loader"],
)
def served(request, tmp_path_factory):
    load_fast, prefix = request.param
    root = tmp_path_factory.mktemp(f"tb-{load_fast}")
    write_run(str(root / "exp" / "a"), range(STEPS), steps_per_epoch=50)
    write_run(str(root / "exp" / "b" / "deep"), range(3), views=ONE)
    # With TensorFlow importable, as on a training machine: the other tests' run without.
    with tensorboard("--logdir", str(root), load_fast=load_fast, path_prefix=prefix,
                     tensorflow=True) as tb:
        # The first load of the logdir runs in the background: wait for every point.
        wait_for(lambda: [r["max_step"] for r in get_json(tb.url("runs"))["runs"]]
                 == [STEPS - 1, 2])
        yield tb, root


def test_tab_is_registered_and_active(served) -> None:
    tb, _ = served
    listing = get_json(tb.base + "/data/plugins_listing")
    entry = listing[metadata.PLUGIN_NAME]
    assert entry["enabled"] is True
    assert entry["tab_name"] == "Introspect"
    mechanism = entry["loading_mechanism"]
    assert mechanism["type"] == "IFRAME"
    assert tb.root + mechanism["module_path"] == tb.url("index.js")


def test_routes_under_path_prefix_keep_every_point(served) -> None:
    tb, _ = served
    runs = get_json(tb.url("runs"))["runs"]
    assert [r["run"] for r in runs] == ["exp/a", "exp/b/deep"]
    doc = get_json(tb.url("run?run=exp/a"))
    assert [t["num_points"] for t in doc["views"]["gradient"]] == [STEPS] * 4
    tag = "introspect/output/dense_1"
    series = get_json(tb.url(f"series?run=exp/a&tag={tag}&field=rms"))["series"][tag]
    assert series["steps"] == list(range(STEPS)) and len(series["values"]["rms"]) == STEPS
    ov = get_json(tb.url("overview?run=exp/a"), gzip_ok=True)
    assert ov["views"]["variable"]["steps"] == list(range(STEPS))
    assert ov["metrics"]["loss"]["epoch_band"]["epochs"] == [0, 1, 2]
    # The prefix is really in effect: the unprefixed path is not this plugin.
    assert tb.base != tb.root
    assert fetch(tb.root + "/data/plugin/introspect/runs")[0] == 404


def test_errors_and_static_files_through_tensorboard(served) -> None:
    tb, _ = served
    for route, code in [("run?run=nope", 404), ("series?run=exp/a&tag=nope", 404),
                        ("series?run=exp/a", 400), ("overview", 400),
                        ("static/%2e%2e/%2e%2e/metadata.py", 404),
                        ("static/..%2Fintrospect_plugin.py", 404)]:
        status, headers, body = fetch(tb.url(route))
        assert status == code, (route, status, body[:200])
        assert json.loads(body)["error"]
    status, headers, body = fetch(tb.url("index.js"), gzip_ok=True)
    assert status == 200 and headers["Content-Type"].startswith("text/javascript")
    assert b"render" in body
    status, headers, _ = fetch(tb.url("overview?run=exp/a"), gzip_ok=True)
    assert headers["Content-Encoding"] == "gzip" and headers["Content-Type"] == "application/json"


def test_run_written_while_tensorboard_is_open(served) -> None:
    tb, root = served
    live = root / "live"
    write_run(str(live), range(3), views=ONE)
    wait_for(lambda: "live" in [r["run"] for r in get_json(tb.url("runs"))["runs"]])
    tag = "introspect/output/only"

    def steps():
        return get_json(tb.url(f"series?run=live&tag={tag}"))["series"][tag]["steps"]

    wait_for(lambda: steps() == [0, 1, 2])
    assert get_json(tb.url("overview?run=live"))["views"]["output"]["steps"] == [0, 1, 2]
    write_run(str(live), range(3, 7), views=ONE)  # a second event file, as a resumed job makes
    wait_for(lambda: steps() == list(range(7)))
    # The cached overview notices the new points.
    assert get_json(tb.url("overview?run=live"))["views"]["output"]["steps"] == list(range(7))


def test_logdir_spec_and_users_samples_per_plugin(tmp_path) -> None:
    write_run(str(tmp_path / "one" / "r"), range(30), views=ONE)
    write_run(str(tmp_path / "two"), range(30), views=ONE)
    spec = f"first:{tmp_path / 'one'},second:{tmp_path / 'two'}"
    with tensorboard("--logdir_spec", spec, "--samples_per_plugin", "introspect=5") as tb:
        runs = wait_for(lambda: get_json(tb.url("runs"))["runs"])
        names = sorted(r["run"] for r in runs)
        # TensorBoard names a spec entry's own folder "<name>/.".
        assert names == ["first/r", "second/."]
        assert get_json(tb.url("run?run=" + quote("second/.")))["run"] == "second/."
        doc = get_json(tb.url("run?run=first/r"))
        # The user's value wins over the plugin's "keep everything" default.
        assert doc["views"]["output"][0]["num_points"] == 5
        assert doc["views"]["output"][0]["last_step"] == 29


def test_inactive_without_introspect_data(tmp_path) -> None:
    writer = EventFileWriter(str(tmp_path / "scalars_only"))
    summary = summary_pb2.Summary()
    summary.value.add(tag="loss", simple_value=1.0)
    writer.add_event(event_pb2.Event(step=0, wall_time=1.0, summary=summary))
    writer.add_event(event_pb2.Event(step=1, wall_time=2.0, summary=summary_pb2.Summary(
        value=[summary_pb2.Summary.Value(tag="x", tensor=tensor_util.make_tensor_proto(1.0))])))
    writer.close()
    with tensorboard("--logdir", str(tmp_path), load_fast="true") as tb:
        wait_for(lambda: get_json(tb.base + "/data/plugins_listing")["scalars"]["enabled"])
        assert get_json(tb.base + "/data/plugins_listing")["introspect"]["enabled"] is False
        assert get_json(tb.url("runs"))["runs"] == []
        assert "not found" in get_json(tb.url("overview?run=scalars_only"), expect=404)["error"]
