"""The one schema: ``schema.schema()``, its generated ES module, and the frontend's spelling.

The tab's names and chart texts come from ``frontend/src/schema.js``, generated from
``metadata.py`` and ``schema.py``; these tests fail when the committed module is stale or
the two languages would name a slot differently.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
from pathlib import Path

import pytest

from tb_introspect import schema, schema_js, slots

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def test_the_committed_schema_js_is_generated_from_metadata() -> None:
    committed = (ROOT / schema_js.TARGET).read_text(encoding="utf-8")
    assert committed == schema_js.render(), (
        "frontend/src/schema.js is stale: run `python -m tb_introspect.schema_js`"
        " (or `make frontend`) and commit it")
    assert schema_js.default_path() == ROOT / schema_js.TARGET


def test_check_flags_a_stale_module_and_writing_fixes_it(tmp_path: Path, capsys) -> None:
    path = tmp_path / "schema.js"
    assert schema_js.main(["--check", str(path)]) == 1  # missing
    path.write_text(schema_js.render().replace("|Δw| / |Σg|", "|Δw| / |g|"), encoding="utf-8")
    assert schema_js.main(["--check", str(path)]) == 1
    assert "stale" in capsys.readouterr().err
    assert schema_js.main([str(path)]) == 0
    assert schema_js.main(["--check", str(path)]) == 0
    assert path.read_text(encoding="utf-8") == schema_js.render()


def test_the_schema_is_plain_json() -> None:
    s = schema.schema()
    assert json.loads(json.dumps(s)) == s
    # One constant per key: upper-case keys that stay distinct.
    assert len({k.upper() for k in s}) == len(s)


def test_the_schema_rebuilds_every_tensor_layout() -> None:
    s = schema.schema()
    rule = s["quantile_field"]
    qs = (0.0, 2.5, 50.0, 97.5, 100.0)

    def field(q: float, log: bool = False) -> str:
        return (rule["log_prefix"] if log else rule["prefix"]) + format(q, rule["format"])

    assert rule["significant_digits"] == len(format(1 / 3, "g")) - 2  # "0.333333"
    for view in s["views"]:
        extra = s["view_extra_fields"][view]
        if view == "variable":
            extra = extra + [s["ilr_prefix"] + field(q) for q in qs]
        layout = (s["base_fields"] + [field(q) for q in qs] + [field(q, True) for q in qs]
                  + extra)
        assert tuple(layout) == slots.tensor_stats_fields(view, qs), view
    for q, plain, log in rule["examples"]:
        assert (plain, log) == (slots.quantile_field(q), slots.quantile_field(q, log=True))
    assert tuple(s["metric_epoch_fields"]) == slots.METRIC_EPOCH_FIELDS
    assert len(s["metric_epoch_band_fields"]) == 5
    assert set(s["window_step_fields"]) <= set(slots.VIEW_EXTRA_FIELDS["output"])
    assert set(s["activity_fields"]) <= set(s["base_fields"])
    assert set(s["slot_labels"]) <= set(s["base_fields"])
    assert list(s["view_labels"]) == list(s["views"]) == list(s["view_help"])


def test_every_text_on_the_implicit_learning_rate_quotes_the_one_formula() -> None:
    texts = [c["help"] for c in schema.CHARTS.values()] + list(schema.SLOT_HELP.values())
    ilr = [t for t in texts if "Σg" in t or "implicit learning rate" in t]
    assert len(ilr) >= 2
    for t in ilr:
        assert schema.FORMULAS["implicit_lr"] in t and schema.GRADIENT_SUM in t, t
    assert schema.FORMULAS["update_ratio"] in schema.CHARTS["layers.update"]["help"]


@pytest.mark.parametrize("doc", ["format.md", "http_api.md", "reading-the-tab.md"])
def test_the_docs_write_the_implicit_learning_rate_as_the_code(doc: str) -> None:
    text = (DOCS / doc).read_text(encoding="utf-8")
    assert schema.FORMULAS["implicit_lr"] in text
    for wrong in ("|mean gradient|", "|Δw| / |g|", "|Δw|/|g|"):
        assert wrong not in text, (doc, wrong)


@pytest.mark.skipif(shutil.which("node") is None, reason="needs Node.js")
def test_the_frontend_spells_slot_names_as_python() -> None:
    rng = random.Random(7)
    qs = ([0.0, 100.0, 2.0 ** -10, 1e-5, 0.1 + 0.2]
          + [rng.uniform(0, 100) for _ in range(200)]
          + [10 ** rng.uniform(-9, 2) for _ in range(200)]
          + [round(rng.uniform(0, 100), rng.randint(0, 7)) for _ in range(200)])
    script = (
        'import { ilrField, quantileField } from "./src/slots.js";\n'
        f"const qs = {json.dumps(qs)};\n"
        "console.log(JSON.stringify(qs.map((q) => [quantileField(q, false),"
        " quantileField(q, true), ilrField(q)])));\n"
    )
    out = subprocess.run(["node", "--input-type=module", "-e", script], cwd=ROOT / "frontend",
                         capture_output=True, text=True, timeout=60, check=True).stdout
    got = json.loads(out)
    want = [[slots.quantile_field(q), slots.quantile_field(q, log=True),
             slots.ILR_PREFIX + slots.quantile_field(q)] for q in qs]
    assert got == want
