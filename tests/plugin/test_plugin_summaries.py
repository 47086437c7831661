"""The first screen from view summaries (format 3) against the per-tensor tags (format 2).

The same synthetic run is written twice, with and without view summaries; the plugin must
serve the same Overview charts and ``./run`` from both (the summary's float32 rounding
aside), the findings from ``./findings``, and fall back to the per-tensor tags when a
summary does not cover its view.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from tb_introspect import metadata, slots
from tb_introspect.plugin import summaries
from tb_introspect.read import provider
from tb_introspect.read.series import TagInfo
from tests.plugin.plugin_testlib import LAYOUT, App, write_run

STEPS = range(0, 60)


@pytest.fixture(scope="module")
def apps(tmp_path_factory):
    root = tmp_path_factory.mktemp("summaries")
    write_run(str(root / "v2"), STEPS, format_version=2)
    write_run(str(root / "v3"), STEPS, summaries=True, format_version=3)
    # The output view's summary misses a tensor: that run must read its per-tensor tags.
    rows = {"output": ["dense", "dense_1"]}
    write_run(str(root / "partial"), STEPS, summaries=True, summary_rows=rows)
    # Another model's rows written later into the same run directory: TensorBoard keeps the
    # first metadata, so those points' rows are not the ones it names.
    write_run(str(root / "rewritten"), range(0, 30), summaries=True)
    write_run(str(root / "rewritten"), range(30, 60), summaries=True,
              summary_rows={"output": ["out", "dense", "dense_1"]})
    # A real run of the last version-1 writer: no summaries, read from its own tags.
    shutil.copytree(Path(__file__).parents[1] / "data" / "format_v1" / "adam_cnn", root / "v1")
    return App(str(root))


def _close(a, b, path=""):
    """Equal JSON, floats to float32 precision (the summary's dtype)."""
    if isinstance(a, dict):
        assert set(a) == set(b), path
        for k in a:
            _close(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _close(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and isinstance(b, float):
        assert np.isclose(a, b, rtol=1e-5, atol=1e-7), (path, a, b)
    else:
        assert a == b, (path, a, b)


def test_overview_from_summaries_draws_what_the_tensor_tags_draw(apps) -> None:
    v2 = apps.get("overview?run=v2")
    v3 = apps.get("overview?run=v3")
    assert v2["findings"] is not None
    assert v3["findings"] is None  # the rules need every slot: ./findings
    v2.pop("findings")
    v3.pop("findings")
    # The run name differs; everything drawn is the same.
    v2.pop("run"), v3.pop("run")
    _close(v2, v3)


def test_versions_1_2_and_3_are_read(apps) -> None:
    for run, version, from_summaries in (("v1", 1, False), ("v2", 2, False), ("v3", 3, True)):
        doc = apps.get(f"run?run={run}")
        assert doc["format_version"] == version
        assert all(doc["views"][v] for v in slots.VIEWS), run
        ov = apps.get(f"overview?run={run}")
        assert (ov["findings"] is None) == from_summaries, run
        assert isinstance(apps.get(f"findings?run={run}")["findings"], list)
        for view in slots.VIEWS:
            rms = ov["views"][view]["log10_rms"]
            assert len(rms) == len(doc["views"][view]) and any(
                x is not None for row in rms for x in row), (run, view)


def test_findings_route_serves_the_findings_of_the_tensor_tags(apps) -> None:
    assert apps.get("findings?run=v3")["findings"] == apps.get("overview?run=v2")["findings"]
    # Format 2 runs answer it too (the same sampled read as their overview).
    assert apps.get("findings?run=v2")["findings"] == apps.get("overview?run=v2")["findings"]
    apps.get("findings?run=nope", status=404)
    apps.get("findings", status=400)


def test_run_document_from_summaries_lists_every_tensor_with_its_own_layout(apps) -> None:
    v2, v3 = apps.get("run?run=v2"), apps.get("run?run=v3")
    for view in slots.VIEWS:
        a, b = v2["views"][view], v3["views"][view]
        assert [e["tag"] for e in a] == [e["tag"] for e in b]
        for x, y in zip(a, b, strict=True):
            assert y["fields"] == list(slots.tensor_stats_fields(view))
            assert y["num_points"] is None  # a row's own tag may hold fewer points
            for key in ("first_step", "last_step", "first_epoch", "last_epoch", "layer",
                        "depth", "shape", "quantiles"):
                assert x[key] == y[key], (view, x["tag"], key)
    assert v2["metrics"] == v3["metrics"]
    assert v3["format_version"] == 3


def test_a_summary_missing_a_tensor_falls_back_to_the_tensor_tags(apps) -> None:
    doc = apps.get("overview?run=partial")
    assert doc["findings"] is not None
    names = [t["name"] for t in doc["views"]["output"]["tensors"]]
    assert sorted(names) == sorted(n for n, _, _ in LAYOUT["output"])


def test_points_whose_rows_are_not_the_metadata_rows_fall_back(apps) -> None:
    doc = apps.get("overview?run=rewritten")
    assert doc["findings"] is not None  # read from the per-tensor tags
    assert len(doc["views"]["output"]["steps"]) == 60


def test_row_keys_are_exact_in_float32() -> None:
    tags = [metadata.stats_tag("output", f"layer_{i}") for i in range(1000)]
    keys = [slots.row_key(t) for t in tags]
    assert all(np.float32(k) == k for k in keys)
    assert len(set(keys)) > 995  # 24 bits: collisions are rare, and only weaken the check


def test_a_summary_tag_is_not_a_series(apps) -> None:
    tag = metadata.summary_tag("variable")
    err = apps.get(f"series?run=v3&tag={tag}", status=400)
    assert "view summary" in err["error"]


def test_covering_needs_every_view_covered() -> None:
    def info(tag, kind, view, rows=()):
        return TagInfo(tag=tag, kind=kind, version=3, name=tag, fields=("rms",),
                              view=view, rows=tuple(rows))

    a, b = metadata.stats_tag("output", "a"), metadata.stats_tag("output", "b")
    g = metadata.stats_tag("gradient", "a")
    s_out = info("s_out", provider.KIND_VIEW_SUMMARY, "output", [a, b])
    infos = {t.tag: t for t in (info(a, provider.KIND_TENSOR_STATS, "output"),
                                info(b, provider.KIND_TENSOR_STATS, "output"), s_out)}
    assert summaries.covering(infos) == {"output": s_out}
    infos[g] = info(g, provider.KIND_TENSOR_STATS, "gradient")
    assert summaries.covering(infos) is None  # the gradient view has no summary
    infos["s_g"] = info("s_g", provider.KIND_VIEW_SUMMARY, "gradient", [g])
    assert set(summaries.covering(infos)) == {"output", "gradient"}
    assert summaries.covering({}) is None
