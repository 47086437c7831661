"""The Overview's Transformer section in headless Chromium, on a small real PyTorch language
model (the demo's GPT) trained once for this module with the ``Introspector`` (its probes:
attention logits, the LM head's logits, every layer output's median |a| and kurtosis).

- the section shows the four charts, each drawn, with the reference threshold it names;
- the readouts agree with what ``./probes`` serves;
- a run without probes has no section;
- an attention-logit finding jumps to the attention chart (a run written with
  ``summary_pb.probes_pb`` whose logits grow past 100: the rule's input, not a training's
  chaos);
- no console error anywhere.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tb_introspect import schema, summary_pb
from tb_introspect.writer import NumpyWriter
from tests.browser.browser_session import MIN_PIXELS, Session, readout_pairs
from tests.browser.browser_support import tensorboard, write_run

pytestmark = pytest.mark.browser

STEPS, WINDOW = 60, 10
CHARTS = ("probes-attn", "probes-head", "probes-ratio", "probes-kurtosis")


def train_lm(log_dir: Path) -> None:
    """The demo's small GPT at its stable low rate (tb_introspect/demo/gpt.py), 60 steps,
    a point every 10: two attention layers, an LM head and every layer output probed."""
    from tb_introspect.demo import gpt

    gpt.train(gpt.STORIES["gpt_low_lr"], steps=STEPS, log_dir=str(log_dir), window=WINDOW,
              track_logits=False)


def write_unstable(log_dir: Path) -> None:
    """A run whose one attention layer's logits grow from 5 past 100 (probes every 10 steps)."""
    write_run(log_dir.parent, log_dir.name, views=("output",), steps=60)
    with NumpyWriter(log_dir, filename_suffix=".probes") as w:
        for k, step in enumerate(range(10, 61, 10)):
            logit = 5.0 * 2.0 ** k  # 5, 10, ..., 160
            w.add_summary(summary_pb.probes_pb(
                {"blocks.0.attn": [math.nan, math.nan, logit, math.nan, math.nan]},
                with_metadata=k == 0), step, wall_time=1.7e9 + step)


@pytest.fixture(scope="module")
def tb(tmp_path_factory):
    root = tmp_path_factory.mktemp("transformer") / "logs"
    train_lm(root / "lm")
    write_run(root, "plain", steps=40)  # format 4, no probes
    write_unstable(root / "unstable")
    with tensorboard(root, wait_runs=3, reload=False) as server:
        yield server


def test_the_transformer_section_draws_the_probes_with_their_references(browser, tb):
    doc = tb.get_json("probes?run=lm")
    kinds = {r["name"]: r["kind"] for r in doc["rows"]}
    attention = sorted(k for k, v in kinds.items() if v == "attention")
    assert len(attention) == 2, kinds  # one per block
    assert [k for k, v in kinds.items() if v == "head"] == ["head"]
    s = Session(browser, tb, embedded=False)
    try:
        f = s.open("p.introspect.run=lm")
        f.wait_for_selector("#sec-transformer[data-state=ready]", timeout=60_000)
        assert f.locator("#sec-transformer").is_visible()
        assert f.locator("#sec-transformer h2").inner_text().startswith("Transformer")
        names = f.locator("#sec-transformer .chart").evaluate_all(
            "(cs) => cs.map((c) => c.dataset.chart)")
        assert tuple(names) == CHARTS
        pixels = s.coloured("#sec-transformer .chart canvas")
        assert min(pixels) >= MIN_PIXELS, dict(zip(names, pixels, strict=True))
        refs = schema.PROBE_REFERENCES
        for chart, ref in (("probes-attn", refs["attn_logit_max"]),
                           ("probes-ratio", refs["massive_ratio"]),
                           ("probes-kurtosis", refs["kurtosis"])):
            c = f.locator(f'.chart[data-chart="{chart}"]')
            assert readout_pairs(c)["reference"] == f"{ref:g}", chart
            assert f"{ref:g} (reference)" in c.locator(".chart-legend").text_content()
        attn = f.locator('.chart[data-chart="probes-attn"]')
        legend = attn.locator(".chart-legend").text_content()
        assert all(name in legend for name in attention), legend
        # The readout at the last point names the larger attention layer, with its value.
        last = {r["name"]: doc["values"]["attn_logit_max"][i][-1]
                for i, r in enumerate(doc["rows"]) if r["kind"] == "attention"}
        top = max(last, key=last.get)
        name, value = readout_pairs(attn)["largest"].rsplit(" ", 1)
        assert name == top and float(value) == pytest.approx(last[top], rel=1e-3)
        assert readout_pairs(attn)["@"].startswith(f"step {doc['steps'][-1]}")
        s.hover(f.locator('.chart[data-chart="probes-head"]'), 0.02)
        head = readout_pairs(f.locator('.chart[data-chart="probes-head"]'))
        i = [r["name"] for r in doc["rows"]].index("head")
        assert float(head["max"]) == pytest.approx(doc["values"]["logit_max"][i][0], rel=1e-3)
        assert float(head["log Z"]) == pytest.approx(doc["values"]["logit_lse"][i][0], rel=1e-3)
        s.shot("transformer-lm")
    finally:
        s.close()


def test_a_run_without_probes_has_no_section(browser, tb):
    s = Session(browser, tb, embedded=False)
    try:
        f = s.open("p.introspect.run=plain")
        f.wait_for_selector("#sec-transformer[data-state=none]", state="attached",
                            timeout=30_000)
        assert not f.locator("#sec-transformer").is_visible()
        assert f.locator("#sec-transformer .chart").count() == 0
    finally:
        s.close()


def test_an_attention_finding_jumps_to_its_chart(browser, tb):
    s = Session(browser, tb, embedded=False)
    try:
        f = s.open("p.introspect.run=unstable")
        f.wait_for_selector("#sec-transformer[data-state=ready]", timeout=30_000)
        item = f.locator('li.finding[data-kind="attention_logit_growth"]')
        assert item.count() == 1
        assert "blocks.0.attn" in item.text_content()
        item.locator(".f-title").click()
        f.wait_for_selector('.chart[data-chart="probes-attn"].flash', timeout=5_000)
    finally:
        s.close()
