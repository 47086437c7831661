"""The Introspect tab in headless Chromium, served by a real TensorBoard.

A real ``tensorboard`` process serves a logdir written by the real numpy
writer (tests/browser/browser_support.py); Playwright drives Debian's Chromium. What the tab
does with TensorBoard (its URL, theme, reload button, path prefix) is tested in TensorBoard's
own page (``/#introspect``, the tab in an iframe: the ``tb_page`` fixture); the rest on the
tab's page alone (``session``), which costs the browser a third as much.
The fixture's statistics are known functions of the step, so hover readouts
are checked against exact numbers. Screenshots go to artifacts/screenshots/.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.browser.browser_session import COLUMN_JS, Session, readout_pairs
from tests.browser.browser_support import (
    HTML_LAYER,
    TENSORS,
    known_loss,
    known_lr,
    known_rms,
    next_paint,
    plugin_frame,
    tensorboard,
    write_fixture_logdir,
    write_run,
)
from tests.plugin.plugin_testlib import wait_for

pytestmark = pytest.mark.browser

@pytest.fixture(scope="module")
def logdir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("browser") / "logs"
    write_fixture_logdir(root)
    write_run(root, "long", views=("gradient",), steps=600)
    return root


@pytest.fixture(scope="module")
def tb(logdir):
    with tensorboard(logdir, wait_runs=4, reload=False) as server:
        yield server


@pytest.fixture
def session(browser, tb):
    """The tab's page alone (``browser_session.BARE_PAGE``): what the tab does by itself."""
    s = Session(browser, tb, embedded=False)
    yield s
    s.close()


@pytest.fixture
def tb_page(browser, tb):
    """The tab in TensorBoard's page: what needs TensorBoard (its URL, theme, reload button)."""
    s = Session(browser, tb)
    yield s
    s.close()


def panel_sel(tag: str) -> str:
    """CSS selector of the panel of ``tag`` (names may hold quotes)."""
    return '.panel[data-tag="' + tag.replace("\\", "\\\\").replace('"', '\\"') + '"]'


def head_step(head: str) -> int:
    return int(re.match(r"step (\d+)", head).group(1))


def tensor_index(view: str, name: str) -> int:
    return [t[0] for t in TENSORS[view]].index(name)


def test_overview_draws_every_chart(session):
    f = session.open("p.introspect.run=exp1%2Flr_0.1")
    # 2 metrics + 4 views x 3 charts + 2 implicit-learning-rate charts, all with data drawn.
    counts = session.coloured()
    assert len(counts) == 16, counts
    assert min(counts) > 300, counts
    for view in ("variable", "gradient", "output", "output_gradient"):
        assert f.locator(f"#sec-{view} .chart").count() == 3
    # The implicit learning rate row sits under the weights; the fixture's median is the rate.
    assert f.locator("#sec-variable + #sec-ilr .chart").count() == 2
    ilr = readout_pairs(f.locator('.chart[data-chart="variable-ilr-bands"]'))
    assert head_step(ilr["@"]) == 120
    assert float(ilr["median"]) == pytest.approx(known_lr("exp1/lr_0.1"), rel=1e-6)
    assert f.locator("#findings h2").text_content().startswith("Findings")
    # The loss readout (cursor elsewhere: the last point) shows the exact value.
    loss = f.locator('.chart[data-chart="metric-loss"]')
    pairs = readout_pairs(loss)
    assert head_step(pairs["@"]) == 120
    assert float(pairs["loss"]) == pytest.approx(known_loss("exp1/lr_0.1", 120), rel=1e-5)
    # Filled bands, not just lines: the per-epoch loss band between two epoch
    # ends, and the RMS percentile bands, cover many pixels of a canvas column.
    for sel in ('.chart[data-chart="metric-loss"]', '.chart[data-chart="gradient-rms-bands"]'):
        assert f.evaluate(COLUMN_JS, [sel, 0.62]) > 12, sel
    session.shot("overview")
    # Full overview in a tall window, for the eye.
    session.page.set_viewport_size({"width": 1400, "height": 2300})
    session.wait_ready()
    next_paint(f)
    session.shot("overview-full")


def test_findings_most_severe_first_and_jump_to_evidence(session):
    f = session.open("p.introspect.run=exp1%2Flr_0.1")
    items = f.locator(".finding")
    # The real rules (tb_introspect.diagnose) on the fixture: NaN gradients (critical),
    # then the output layer's exact zeros (the fixture's head is rectified, a warning) and
    # conv2's dead channels (info: they died while the loss came down), most severe first.
    assert [items.nth(i).get_attribute("data-severity") for i in range(items.count())] == [
        "critical", "warning", "info"]
    assert [items.nth(i).get_attribute("data-kind") for i in range(3)] == [
        "nonfinite", "rectified_output", "dead_units"]
    assert f'{HTML_LAYER}/kernel' in items.nth(0).locator(".f-title").text_content()
    assert "1 critical" in f.locator(".findings h2").text_content()
    session.shot("overview-findings")
    # Critical -> the NaN tensor's panel in Layers.
    items.nth(0).locator(".f-title").click()
    session.wait_ready()
    assert f.locator(".tab.on").text_content() == "Layers"
    assert f.locator(".panel.focused").get_attribute("data-tag") == \
        f"introspect/gradient/{HTML_LAYER}/kernel"
    # Warning -> conv2's activity panel.
    session.click('.tab[data-tab="overview"]')
    f.locator('.finding[data-kind="dead_units"]').locator(".f-title").click()
    session.wait_ready()
    assert f.locator(".tab.on").text_content() == "Activity"
    assert f.locator(".panel.focused").get_attribute("data-tag") == "introspect/output/conv2"
    assert f.locator(".panel.focused .final").text_content() == "dead 55.0%"
    session.shot("activity-focused")


def test_hover_readouts_are_exact(session):
    run, view, name = "exp1/lr_0.01", "gradient", "conv2/kernel"
    f = session.open(f"p.introspect.tab=layers&p.introspect.run={run.replace('/', '%2F')}"
                     "&p.introspect.view=gradient")
    panel = f.locator(panel_sel(f"introspect/{view}/{name}"))
    index = tensor_index(view, name)
    for mode, fx in (("rms", 0.37), ("magnitude", 0.61), ("values", 0.83)):
        panel.locator(f'button[data-mode="{mode}"]').click()
        f.wait_for_function(
            "([tag, mode]) => document.querySelector(`.panel[data-tag=\"${CSS.escape(tag)}\"]`"
            "  + `[data-drawn=\"${mode}\"] .chart`)",
            arg=[f"introspect/{view}/{name}", mode])
        session.hover(panel, fx)
        pairs = readout_pairs(panel)
        step = head_step(pairs["@"])
        assert 10 < step < 115, pairs
        rms = known_rms(run, view, index, step)
        if mode == "rms":
            assert float(pairs["RMS"]) == pytest.approx(rms, rel=1e-5)
        elif mode == "magnitude":
            # Half-normal quantiles of the fixture: median |x| = 0.6745 rms.
            assert float(pairs["|x| median"]) == pytest.approx(0.6745 * rms, rel=1e-5)
            assert float(pairs["|x| max"]) == pytest.approx(3.0 * rms, rel=1e-5)
            assert pairs["zeros"] == "0.0%"
        else:
            assert float(pairs["max"]) == pytest.approx(3.0 * rms, rel=1e-5)
            assert float(pairs["25%"]) == pytest.approx(-0.6745 * rms, rel=1e-5)
            assert float(pairs["median"]) == 0.0
    assert f.locator(".panel canvas").count() == len(TENSORS[view])
    assert min(session.coloured(".panel canvas")) > 300
    session.shot("layers-hover")
    # The chosen mode is kept per panel in the URL.
    session.wait_url("p.introspect.modes=")


def test_nan_is_a_gap_with_counts(session):
    view, name = "gradient", HTML_LAYER + "/kernel"
    f = session.open("p.introspect.tab=layers&p.introspect.run=exp1%2Flr_0.1"
                     "&p.introspect.lmode=rms")
    panel = f.locator(".panel").filter(has=f.locator(".panel-name", has_text=name))
    box = panel.locator(".u-over").bounding_box()
    # Steps 100..103 are NaN: find the cursor position of step 101 (x range 1..120).
    found = None
    for k in range(-6, 7):
        fx = (101 - 1) / 119 + k / box["width"]
        session.hover(panel, fx)
        pairs = readout_pairs(panel)
        if head_step(pairs["@"]) == 101:
            found = pairs
            break
    assert found is not None, "could not place the cursor on step 101"
    assert found["RMS"] == "—"
    assert "NaN ×5" in panel.locator(".readout .warn").text_content()
    # The line has a gap: no data pixels in the canvas column between steps 101 and 102.
    tag = f"introspect/{view}/{name}"
    column = [f.evaluate(COLUMN_JS, [tag, (101.5 - 1) / 119]), f.evaluate(COLUMN_JS, [tag, 0.3])]
    assert column[0] == 0 and column[1] > 0, column


def test_html_in_names_renders_as_text(session):
    f = session.open("p.introspect.tab=layers&p.introspect.run=exp1%2Flr_0.1"
                     "&p.introspect.view=variable")
    names = f.locator(".panel-name").all_text_contents()
    assert HTML_LAYER + "/kernel" in names
    assert f.locator(".panel-name b, .panel-meta b").count() == 0
    session.click('.tab[data-tab="activity"]')
    label = f.locator(panel_sel(f"introspect/output/{HTML_LAYER}") + " .panel-name")
    assert label.text_content() == HTML_LAYER
    # The overview's activity readout names the worst layer, as text.
    session.click('.tab[data-tab="overview"]')
    readout = f.locator('.chart[data-chart="output-activity"] .readout')
    assert HTML_LAYER in readout.text_content()
    assert f.locator(".readout b b, .readout .v b").count() == 0


def test_empty_views_say_so(session):
    f = session.open("p.introspect.run=gradients_only")
    for view, words in (("variable", "weights"), ("output", "layer outputs"),
                        ("output_gradient", "output gradients")):
        note = f.locator(f"#sec-{view} .empty")
        assert f"No {words} statistics were logged" in note.text_content()
        assert f.locator(f"#sec-{view} canvas").count() == 0
    assert f.locator("#sec-gradient canvas").count() == 3
    # No weights, so no implicit learning rate: one line, no chart.
    assert "No implicit learning rate in this run" in f.locator("#sec-ilr .empty").text_content()
    assert f.locator("#sec-ilr canvas").count() == 0
    session.click('.tab[data-tab="activity"]')
    assert "No layer outputs statistics were logged in run “gradients_only”" in \
        f.locator(".empty").first.text_content()


def test_stack_plot_hover_names_layer_and_click_opens_it(session):
    run = "exp1/lr_0.1"
    f = session.open("p.introspect.run=exp1%2Flr_0.1")
    stack = f.locator('.chart[data-chart="gradient-stack"]')
    # Near the bottom: the first layer's band (conv1, depth 0).
    session.hover(stack, 0.5, 0.97)
    name = stack.locator(".layer-name").text_content()
    assert name.startswith("conv1 · conv1/"), name
    tensor = name.split(" · ")[1]
    pairs = readout_pairs(stack)
    step = head_step(pairs["@"])
    rms = known_rms(run, "gradient", tensor_index("gradient", tensor), step)
    # The overview sends log10(RMS) to 4 decimals.
    assert float(pairs["RMS"]) == pytest.approx(rms, rel=2e-4)
    session.shot("overview-stack-hover")
    over = stack.locator(".u-over")
    box = over.bounding_box()
    over.click(position={"x": box["width"] * 0.5, "y": box["height"] * 0.97})
    session.wait_ready()
    assert f.locator('.tab.on').text_content() == "Layers"
    focused = f.locator(".panel.focused")
    assert focused.count() == 1
    assert focused.get_attribute("data-tag") == f"introspect/gradient/{tensor}"
    session.shot("layers-focused")


def test_state_in_url_survives_reload(tb_page):
    f = tb_page.open()
    tb_page.click('.tab[data-tab="activity"]')
    tb_page.click('.segmented[aria-label="x axis"] button[data-value="epoch"]')
    tb_page.wait_url("p.introspect.x=epoch")
    url = tb_page.page.url
    assert "#introspect" in url
    assert "p.introspect.tab=activity" in url and "p.introspect.x=epoch" in url
    tb_page.page.reload()
    tb_page.frame = plugin_frame(tb_page.page)
    tb_page.wait_ready()
    f = tb_page.frame
    assert f.locator(".tab.on").text_content() == "Activity"
    epoch = f.locator('.segmented[aria-label="x axis"] button[data-value="epoch"]')
    assert "on" in epoch.get_attribute("class")
    counts = tb_page.coloured()
    assert counts and min(counts) > 100, counts


def test_layer_modes_buttons_fields_and_url_follow_one_table(tb_page):
    run = "p.introspect.tab=layers&p.introspect.run=exp1%2Flr_0.01"
    all_panels = '.segmented[aria-label="mode of all panels"] button'
    f = tb_page.open(run + "&p.introspect.view=variable")
    # A view's own modes are offered in that view only.
    assert f.locator(all_panels).all_text_contents() == [
        "default", "values", "|x| log", "RMS", "Δw/w", "ILR"]
    assert set(f.locator(".panel").evaluate_all("ps => ps.map(p => p.dataset.mode)")) == {"values"}
    tb_page.click(all_panels + '[data-mode="update"]')
    tb_page.wait_url("p.introspect.lmode=update")
    f.wait_for_function("document.querySelectorAll('.panel[data-drawn=\"update\"] .chart')"
                        ".length === document.querySelectorAll('.panel').length")
    chart = f.locator('.panel[data-drawn="update"] .chart').first
    tb_page.hover(chart, 0.5)
    assert readout_pairs(chart)["‖Δw‖/‖w‖"] == "0.001"
    # The implicit learning rate: from the URL, every panel; the fixture's median is the rate.
    tb_page.page.goto("about:blank")  # a hash-only change would not load the page again
    f = tb_page.open(run + "&p.introspect.view=variable&p.introspect.lmode=ilr")
    assert "on" in f.locator(all_panels + '[data-mode="ilr"]').get_attribute("class")
    f.wait_for_function("document.querySelectorAll('.panel[data-drawn=\"ilr\"] .chart')"
                        ".length === document.querySelectorAll('.panel').length")
    chart = f.locator('.panel[data-drawn="ilr"] .chart').first
    tb_page.hover(chart, 0.5)
    pairs = readout_pairs(chart)
    assert float(pairs["median"]) == pytest.approx(known_lr("exp1/lr_0.01"), rel=1e-6)
    assert float(pairs["max"]) == pytest.approx(10 ** 0.5 * known_lr("exp1/lr_0.01"), rel=1e-6)
    assert min(tb_page.coloured()) > 100
    tb_page.click(all_panels + '[data-mode=""]')
    tb_page.page.wait_for_function("() => !location.href.includes('lmode')", timeout=5_000)
    assert set(f.locator(".panel").evaluate_all("ps => ps.map(p => p.dataset.mode)")) == {"values"}
    tb_page.page.goto("about:blank")
    f = tb_page.open(run + "&p.introspect.view=gradient&p.introspect.lmode=cos")
    assert f.locator(all_panels).all_text_contents() == [
        "default", "values", "|x| log", "RMS", "cos"]
    assert "on" in f.locator(all_panels + '[data-mode="cos"]').get_attribute("class")
    assert set(f.locator(".panel").evaluate_all("ps => ps.map(p => p.dataset.mode)")) == {"cos"}
    # A mode the table does not know falls back to the view's default (magnitudes).
    tb_page.page.goto("about:blank")
    f = tb_page.open(run + "&p.introspect.view=gradient&p.introspect.lmode=bogus")
    assert "on" in f.locator(all_panels + '[data-mode=""]').get_attribute("class")
    assert set(f.locator(".panel").evaluate_all("ps => ps.map(p => p.dataset.mode)")) == {
        "magnitude"}


def test_log_linear_toggle_redraws(session):
    f = session.open("p.introspect.run=exp1%2Flr_0.1")
    sel = '.chart[data-chart="gradient-rms-bands"]'
    log_profile = [f.evaluate(COLUMN_JS, [sel, x / 10]) for x in range(1, 10)]
    session.click('.segmented[aria-label="y scale"] button[data-value="linear"]')
    session.wait_url("p.introspect.y=linear")
    lin_profile = [f.evaluate(COLUMN_JS, [sel, x / 10]) for x in range(1, 10)]
    # Same data, other axis: the bands cover a different share of the plot.
    assert min(lin_profile) > 0 and lin_profile != log_profile, (log_profile, lin_profile)


def test_filter_regex(session):
    f = session.open("p.introspect.tab=layers&p.introspect.run=exp1%2Flr_0.01")
    assert f.locator(".panel").count() == 6
    f.locator("input.filter").fill("^conv1/")
    f.wait_for_function("document.querySelectorAll('.panel').length === 2")
    session.wait_ready()
    assert sorted(f.locator(".panel-name").all_text_contents()) == ["conv1/bias", "conv1/kernel"]
    session.wait_url("p.introspect.filter=%5Econv1%2F")
    f.locator("input.filter").fill("conv(")
    f.wait_for_function("document.querySelector('input.filter').classList.contains('bad')")
    assert f.locator(".panel").count() == 2


def test_compare_two_runs_on_the_same_axes(session):
    f = session.open("p.introspect.tab=compare"
                     "&p.introspect.cmp=%5B%22exp1%2Flr_0.01%22%2C%22exp1%2Flr_0.1%22%5D")
    loss = f.locator('.chart[data-chart="compare-loss"]')
    pairs = readout_pairs(loss)
    for run in ("exp1/lr_0.01", "exp1/lr_0.1"):
        assert float(pairs[f"{run} @ 120"]) == pytest.approx(known_loss(run, 120), rel=1e-5)
    counts = session.coloured()
    assert len(counts) >= 2 + 4 * 2 + 6 and min(counts) > 100, counts
    session.shot("compare")
    # Unticking a run removes it from the charts.
    f.locator(".run-choice", has_text="exp1/lr_0.1").locator("input").uncheck()
    session.wait_ready()
    assert "exp1/lr_0.1 @ 120" not in readout_pairs(f.locator('.chart[data-chart="compare-loss"]'))


def test_dark_theme_and_png_export(tb_page, tmp_path):
    f = tb_page.open("p.introspect.run=exp1%2Flr_0.1")
    assert f.evaluate("document.documentElement.dataset.theme") == "light"
    # Theme "auto" follows TensorBoard's own dark mode switch.
    tb_page.page.locator('button[aria-label="Menu for changing light or dark theme"]').click()
    tb_page.page.locator('[title="Force dark TensorBoard theme."]').click()
    f.wait_for_function("document.documentElement.dataset.theme === 'dark'")
    tb_page.wait_ready()
    assert f.evaluate("getComputedStyle(document.body).backgroundColor") == "rgb(32, 33, 36)"
    # An explicit choice in the tab wins over TensorBoard's.
    f.locator("select.theme-select").select_option("light")
    tb_page.wait_ready()
    assert f.evaluate("document.documentElement.dataset.theme") == "light"
    f.locator("select.theme-select").select_option("dark")
    tb_page.wait_ready()
    assert f.evaluate("document.documentElement.dataset.theme") == "dark"
    assert min(tb_page.coloured()) > 300
    tb_page.shot("overview-dark")
    with tb_page.page.expect_download() as info:
        f.locator('.chart[data-chart="gradient-stack"] button.png').click()
    path = tmp_path / "chart.png"
    info.value.save_as(path)
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width = int.from_bytes(data[16:20], "big")
    assert width > 300 and len(data) > 3000
    assert info.value.suggested_filename == "gradient-stack.png"


def wait_step(tb, run: str, step: int) -> None:
    wait_for(lambda: {r["run"]: r for r in tb.get_json("runs")["runs"]}[run]["max_step"] >= step,
             timeout=30, interval=0.3)


def test_refreshes_on_tensorboard_reload(browser, tmp_path):
    """A run that grows while the tab is open: TensorBoard reads it every second; its reload
    button redraws the tab with the new points."""
    logdir = tmp_path / "logs"
    write_run(logdir, "live", views=("gradient",), steps=40)
    with tensorboard(logdir) as live_tb:
        wait_step(live_tb, "live", 40)
        s = Session(browser, live_tb)
        try:
            f = s.open("p.introspect.tab=layers&p.introspect.run=live&p.introspect.lmode=rms")
            assert head_step(readout_pairs(f.locator(".panel").first)["@"]) == 40
            write_run(logdir, "live", views=("gradient",), steps=80, first_step=41)
            wait_step(live_tb, "live", 80)
            # TensorBoard's reload button broadcasts experimental.DataReloaded to the iframe.
            s.page.locator("button.reload-button").click()
            f.wait_for_function(
                "document.querySelector('.panel .readout b')?.textContent.startsWith('step 80')",
                timeout=20_000)
            assert f.locator(".tab.on").text_content() == "Layers"
        finally:
            s.close()


def test_long_run_is_sampled_and_zoom_reads_every_point(session):
    run, view, name = "long", "gradient", "conv2/kernel"
    f = session.open(f"p.introspect.tab=layers&p.introspect.run={run}&p.introspect.lmode=rms")
    panel = f.locator(panel_sel(f"introspect/{view}/{name}"))
    note = panel.locator(".sampled").text_content()
    shown = int(re.search(r"(\d+) of 600 points", note).group(1))
    assert 200 <= shown < 600, note
    assert head_step(readout_pairs(panel)["@"]) == 600  # the last point is always kept
    # Drag-zoom on the middle fifth: the panel is re-read at full resolution.
    over = panel.locator(".u-over")
    over.scroll_into_view_if_needed()
    box = over.bounding_box()
    y = box["y"] + box["height"] / 2
    session.page.mouse.move(box["x"] + 0.4 * box["width"], y)
    session.page.mouse.down()
    session.page.mouse.move(box["x"] + 0.6 * box["width"], y, steps=5)
    session.page.mouse.up()
    f.wait_for_function(
        "(sel) => document.querySelector(sel + ' .sampled').textContent === ''",
        arg=panel_sel(f"introspect/{view}/{name}"))
    # Every step is now under the cursor: consecutive pixels give consecutive steps.
    steps = set()
    for k in range(24):
        session.hover(panel, 0.45 + k / box["width"])
        pairs = readout_pairs(panel)
        step = head_step(pairs["@"])
        steps.add(step)
        rms = known_rms(run, view, tensor_index(view, name), step)
        assert float(pairs["RMS"]) == pytest.approx(rms, rel=1e-5)
    # ~120 steps over ~250 px after the zoom: no step is skipped.
    assert len(steps) >= 6 and sorted(steps) == list(range(min(steps), max(steps) + 1)), steps


def test_path_prefix(browser, logdir):
    with tensorboard(logdir, path_prefix="/proxy/tb", wait_runs=4, reload=False) as prefixed:
        s = Session(browser, prefixed)
        try:
            f = s.open("p.introspect.run=exp1%2Flr_0.01")
            counts = s.coloured()
            assert len(counts) == 16 and min(counts) > 300, counts
            ours = [u for u in s.requests if "/plugin/introspect/" in u or "plugin_entry" in u]
            assert ours and all(u.startswith(prefixed.url + "data/") for u in ours), ours
            s.click('.tab[data-tab="layers"]')
            assert min(s.coloured()) > 300
            assert f.locator(".panel").count() == 6
            s.shot("layers-path-prefix")
        finally:
            s.close()


def test_panel_downloads_every_point_as_csv_and_json(session):
    """A panel's CSV and JSON links download the tensor's series at full resolution."""
    import csv
    import io
    import json

    f = session.open("p.introspect.tab=layers&p.introspect.run=exp1%2Flr_0.1"
                     "&p.introspect.view=gradient")
    tag = "introspect/gradient/conv1/kernel"
    panel = f.locator(panel_sel(tag))
    with session.page.expect_download() as dl:
        panel.locator("a.export", has_text="CSV").click()
    download = dl.value
    assert download.suggested_filename == "exp1_lr_0.1__gradient_conv1_kernel.csv"
    rows = list(csv.reader(io.StringIO(Path(download.path()).read_text())))
    assert rows[0][:4] == ["step", "epoch", "wall_time", "count"] and "rms" in rows[0]
    steps = [int(r[0]) for r in rows[1:]]
    assert steps == list(range(1, 121))  # every point, not the panel's downsampled read
    rms = rows[0].index("rms")
    index = tensor_index("gradient", "conv1/kernel")
    assert float(rows[60][rms]) == pytest.approx(known_rms("exp1/lr_0.1", "gradient", index, 60),
                                                 rel=1e-5)
    with session.page.expect_download() as dl:
        panel.locator("a.export", has_text="JSON").click()
    doc = json.loads(Path(dl.value.path()).read_text())
    assert doc["tag"] == tag and doc["steps"] == steps
