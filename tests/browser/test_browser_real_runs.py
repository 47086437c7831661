"""The Introspect tab on real runs, in headless Chromium: one run in TensorBoard's page, the
others in the tab's page alone (``browser_session.BARE_PAGE``: what needs TensorBoard's page
is tested once, what a run's data can break in every run).

The other browser tests use generated data with known values. Real runs break
the tab in ways that data does not: magnitudes of 1e-40 in a gradient, tensors
that are all zeros, hundreds of tensors per view. Here a session-scoped
fixture (conftest.py) trains real models once per test run (the quick variants of the
four demo runs and a randomly initialised MobileNetV2), a real ``tensorboard``
serves them, and every run is opened in every view and mode. For each:

- no console error or uncaught exception;
- every chart and panel has data pixels drawn;
- no long task over 500 ms on the tab's main thread (PerformanceObserver
  ``longtask``; stretched by the load average per core when the machine is
  oversubscribed, see long_task_budget_ms): the page never freezes;
- the time to the first drawn chart is recorded (``-s`` prints the table).

A numpy-written run with magnitudes far below 1e-25 reproduces the freeze of
uPlot's log-axis splits looping on every log chart.
"""

from __future__ import annotations

import math
import shutil
import urllib.parse
from pathlib import Path

import pytest
from tensorboard.compat.proto import summary_pb2

from tb_introspect import slots, summary_pb
from tb_introspect.demo.models import HEALTHY_LR, MOMENTUM
from tb_introspect.writer import NumpyWriter
from tests.browser.browser_session import (
    COLOURED_PIXELS_JS,
    DEMO_RUNS,
    LONG_TASKS_SINCE_MARK_JS,
    MIN_PIXELS,
    TIMINGS,
    WATCH_FIRST_DRAW_JS,
    Probe,
    long_task_budget_ms,
    readout_pairs,
)
from tests.browser.browser_support import TENSORS, stats_vector, tensorboard
from tests.shared_runs import APP_RUN

pytestmark = pytest.mark.browser


# -- the log-axis freeze, on data that holds it for sure -------------------------------


def write_tiny_run(logdir: Path, run: str = "tiny", steps: int = 40) -> None:
    """A run whose magnitudes go down to 1e-60, one all-zero tensor, a loss reaching 0.

    The values are those of the browser fixture (browser_support.stats_vector),
    scaled down by up to 60 decades: every log axis of the tab (magnitude
    bands, RMS, update ratio, the loss) gets a range far below 1e-25.
    """
    writer = NumpyWriter(logdir / run)
    for step in range(1, steps + 1):
        summary = summary_pb2.Summary()
        for view in slots.VIEWS:
            fields = slots.tensor_stats_fields(view)
            for index, (name, layer, depth, shape) in enumerate(TENSORS[view]):
                v = dict(zip(fields, stats_vector(run, view, index, step, shape), strict=True))
                scale = 10.0 ** (-28 - 5 * index - step / 2)
                zero = index == 1  # one tensor that is exactly zero everywhere
                for f in ("mean", "std", "rms", "l2", "min", "max"):
                    v[f] = 0.0 if zero else v[f] * scale
                for q in slots.DEFAULT_QUANTILES:
                    v[slots.quantile_field(q)] = 0.0 if zero else \
                        v[slots.quantile_field(q)] * scale
                    log_f = slots.quantile_field(q, log=True)
                    v[log_f] = math.nan if zero else v[log_f] + math.log10(scale)
                v["zero_fraction"] = 1.0 if zero else 0.25
                if "update_ratio" in v:
                    v["update_ratio"] = 0.0 if zero else 1e-40 * scale
                s = summary_pb.tensor_stats_pb(
                    [v[f] for f in fields], view=view, name=name, layer=layer, depth=depth,
                    shape=shape,
                )
                summary.value.extend(s.value)
        loss = 0.0 if step == steps else 10.0 ** (-step)
        summary.value.extend(summary_pb.metric_pb("loss", loss, (step - 1) // 10).value)
        writer.add_summary(summary, step, wall_time=1.7e9 + step)
    writer.close()


@pytest.fixture(scope="module")
def tiny_tb(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny") / "logs"
    write_tiny_run(root)
    with tensorboard(root, reload=False) as server:
        yield server


def test_tiny_magnitudes_never_freeze_a_log_axis(browser, tiny_tb):
    """Magnitudes of 1e-30…1e-60 froze the page for ~11 s (log splits), then left it blank."""
    p = Probe(browser, tiny_tb, embedded=False)
    # conv1/bias is zero everywhere: nothing to draw on a log axis.
    zero = ("conv1/bias",)
    try:
        p.open("p.introspect.run=tiny")
        p.check("overview", "tiny")
        p.sweep_layers("tiny", ("variable", "gradient"),
                       skip=lambda name: any(f"-{z}-" in name for z in zero))
        p.act(lambda: p.f.locator('.tab[data-tab="activity"]').click())
        p.check("activity", "tiny")
    finally:
        p.close()


# -- every run, every view -----------------------------------------------------------------



@pytest.fixture(scope="module")
def real_tb(real_logdir):
    with tensorboard(real_logdir, wait_runs=len(DEMO_RUNS) + 1, reload=False) as server:
        yield server
    if TIMINGS:
        # Shown with -s, and kept beside the screenshots.
        lines = [f"{run:28s} {label:32s} {ms:8.0f} ms" for run, label, ms in TIMINGS]
        print("\ntime to the first drawn chart:\n" + "\n".join(lines))
        out = Path(__file__).resolve().parents[2] / "artifacts"
        out.mkdir(exist_ok=True)
        (out / "real_runs_first_draw.txt").write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("run", [*DEMO_RUNS, APP_RUN])
def test_every_view_of_a_real_run(browser, real_tb, run):
    listed = {r["run"]: r for r in real_tb.get_json("runs")["runs"]}[run]
    views = tuple(v for v in slots.VIEWS if listed["views"].get(v))
    assert views, listed
    # One real run in TensorBoard's page; the tab's page alone for the others (browser_session).
    p = Probe(browser, real_tb, embedded=run == DEMO_RUNS[0])
    try:
        p.open(f"p.introspect.run={run}")
        p.check("overview", run)
        p.sweep_layers(run, views)
        # Weights and gradients logged in format 2: the implicit-learning-rate mode was swept
        # wherever a weight moved with a gradient (none does in the dead MLP: no mode then).
        ilr = real_tb.get_json(f"overview?run={run}")["views"]["variable"].get("ilr")
        swept = (run, "layers variable ilr") in {(r, label) for r, label, _ in TIMINGS}
        assert swept == bool(ilr), (run, swept)
        p.sweep_tabs(run)
    finally:
        p.close()


# -- per-channel and spatial activity maps -------------------------------------------------

# The maps section of the Activity view: its state and what it shows.
AMAP_JS = """
() => {
  const s = document.querySelector('section.amap');
  if (!s) return null;
  const o = s.querySelector('.amap-overlay');
  return {
    state: s.dataset.state, layer: s.dataset.layer ?? null, epoch: s.dataset.epoch ?? null,
    label: s.querySelector('.amap-epoch-label')?.textContent ?? null,
    overlay: o ? o.textContent : null, level: o ? o.dataset.level : null,
    charts: [...s.querySelectorAll('.chart')].map((c) => c.dataset.chart),
    nospatial: !!s.querySelector('.amap-nospatial'),
    text: s.innerText,
  };
}
"""

# A checksum of one canvas' pixels: tells whether a redraw changed the picture.
CANVAS_SUM_JS = """
(sel) => {
  const c = document.querySelector(sel);
  const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  let h = 0;
  for (let i = 0; i < d.length; i += 4) {
    h = (h * 31 + d[i] * 7 + d[i + 1] * 3 + d[i + 2]) % 1000000007;
  }
  return h;
}
"""

# True once the section shows layer `name`, drawn.
AMAP_READY_JS = """
(name) => {
  const s = document.querySelector('section.amap');
  return !!s && s.dataset.state === 'ready' && (name === null || s.dataset.layer === name);
}
"""

AMAP_CHART = '.amap .chart[data-chart="{}"] canvas'


def amap(p: Probe) -> dict:
    return p.f.evaluate(AMAP_JS)


def amap_pixels(p: Probe, chart: str) -> int:
    (n,) = p.f.evaluate(COLOURED_PIXELS_JS, AMAP_CHART.format(chart))
    return n


def expected_default(maps: list[dict]) -> str:
    """The layer the section opens: the highest final dead rate, first in depth order."""
    best = maps[0]
    for m in maps:
        if (m["final_dead_rate"] or 0) > (best["final_dead_rate"] or 0):
            best = m
    return best["name"]


def check_map_drawn(p: Probe, label: str, doc: dict, epoch_index: int) -> None:
    """The section shows ``doc`` (./activity) at ``epoch_index``: histogram, maps, overlay."""
    state = amap(p)
    assert state["state"] == "ready" and state["layer"] == doc["name"], (label, state)
    assert state["epoch"] == str(doc["epochs"][epoch_index]), (label, state)
    rates = [r for r in doc["channel_rates"][epoch_index] if r is not None]
    dead = sum(1 for r in rates if r == 0)
    assert state["overlay"].startswith(f"{len(rates)} channel"), (label, state["overlay"])
    assert state["level"] == ("ok" if not dead else "all" if dead == len(rates) else "some")
    assert amap_pixels(p, "amap-hist") >= MIN_PIXELS, label
    if doc["positions"]:
        assert state["charts"] == ["amap-hist", "amap-heat", "amap-alive"], (label, state)
        assert amap_pixels(p, "amap-heat") >= MIN_PIXELS, label
        assert amap_pixels(p, "amap-alive") >= MIN_PIXELS, label
    else:
        assert state["charts"] == ["amap-hist"] and state["nospatial"], (label, state)


def check_hover_readout(p: Probe, doc: dict, epoch_index: int, fx: float, fy: float) -> None:
    """The heat map's readout names the cell under the mouse and its rate."""
    dims = doc["spatial_shape"]
    rows, cols = (1, dims[0]) if len(dims) == 1 else (math.prod(dims[:-1]), dims[-1])
    row, col = int(fy * rows), int(fx * cols)
    canvas = p.f.locator(AMAP_CHART.format("amap-heat"))
    canvas.scroll_into_view_if_needed()
    box = canvas.bounding_box()
    # The middle of the cell: a cell of 112 is 2 px wide.
    p.s.page.mouse.move(box["x"] + (col + 0.5) / cols * box["width"],
                        box["y"] + (row + 0.5) / rows * box["height"])
    rate = doc["spatial_rates"][epoch_index][row * cols + col]
    text = p.f.locator('.amap .chart[data-chart="amap-heat"] .readout').text_content()
    where = f"position {col}" if len(dims) == 1 else f"row {row}, col {col}"
    assert text.startswith(where + ": "), (text, where)
    value = text[len(where) + 2:]
    if rate == 0:
        assert value == "dead (0%)", text
    elif rate < 0.0005:
        assert value == "<0.1%", text
    elif 0.9995 < rate < 1:
        assert value == ">99.9%", text
    else:
        assert abs(float(value.rstrip("%")) - 100 * rate) <= 0.051, (text, rate)


def histogram_bins(rates: list) -> list[int]:
    """The histogram's bars: dead (exactly 0), then 10 bins over (0, 1]."""
    bars = [0] * 11
    for r in rates:
        if r is not None:
            bars[0 if r <= 0 else 1 + min(9, math.floor(r * 10))] += 1
    return bars


def pictures(p: Probe) -> dict[str, int]:
    charts = amap(p)["charts"]
    return {c: p.f.evaluate(CANVAS_SUM_JS, AMAP_CHART.format(c)) for c in charts}


def check_pictures_follow(label: str, doc: dict, a: int, b: int, was: dict, now: dict) -> None:
    """Epoch ``a`` drawn as ``was``, then ``b`` as ``now``: a picture changes when its data does."""
    hist_a, hist_b = (histogram_bins(doc["channel_rates"][i]) for i in (a, b))
    assert (was["amap-hist"] != now["amap-hist"]) == (hist_a != hist_b), (label, hist_a, hist_b)
    if not doc["positions"]:
        return
    sa, sb = doc["spatial_rates"][a], doc["spatial_rates"][b]
    if sa == sb:
        assert (was["amap-heat"], was["amap-alive"]) == (now["amap-heat"], now["amap-alive"])
    # Four steps of the 256-colour scale always change a cell's colour.
    if any(abs((x or 0) - (y or 0)) > 4 / 255 for x, y in zip(sa, sb, strict=True)):
        assert was["amap-heat"] != now["amap-heat"], label
    if [x == 0 for x in sa] != [y == 0 for y in sb]:
        assert was["amap-alive"] != now["amap-alive"], label


def step_epochs(p: Probe, label: str, doc: dict) -> None:
    """◀ and ▶ and the keyboard on the slider: the label, the URL and the pictures follow."""
    n = len(doc["epochs"])
    assert n >= 2, f"{label}: one epoch only"
    before, was = amap(p), pictures(p)
    p.f.evaluate(WATCH_FIRST_DRAW_JS)  # marks the start of the long-task window
    p.f.locator(".amap-prev").click()
    after = amap(p)
    assert after["label"] != before["label"], (label, after["label"])
    check_map_drawn(p, label + " ◀", doc, n - 2)
    check_pictures_follow(label, doc, n - 1, n - 2, was, pictures(p))
    p.s.wait_url(f"p.introspect.aepoch={doc['epochs'][n - 2]}")
    p.f.locator(".amap-next").click()
    check_map_drawn(p, label + " ▶", doc, n - 1)
    assert p.f.locator(".amap-next").is_disabled()
    # The keyboard: arrows on the focused slider.
    p.f.locator("input.amap-epoch").focus()
    p.s.page.keyboard.press("ArrowLeft")
    check_map_drawn(p, label + " ←", doc, n - 2)
    p.s.page.keyboard.press("ArrowRight")
    check_map_drawn(p, label + " →", doc, n - 1)
    long = p.f.evaluate(LONG_TASKS_SINCE_MARK_JS)
    budget = long_task_budget_ms()
    assert max(long, default=0) <= budget, f"{label}: long tasks {long} ms > {budget:.0f}"


def switch_layer(p: Probe, name: str) -> None:
    p.f.evaluate(WATCH_FIRST_DRAW_JS)
    p.f.locator("select.amap-layer").select_option(name)
    p.f.wait_for_function(AMAP_READY_JS, arg=name, timeout=60_000, polling=100)
    long = p.f.evaluate(LONG_TASKS_SINCE_MARK_JS)
    budget = long_task_budget_ms()
    assert max(long, default=0) <= budget, f"{name}: long tasks {long} ms > {budget:.0f}"


def sweep_activity_maps(p: Probe, tb, run: str) -> None:
    """Open the section, check the default layer, step epochs, switch to a conv and a dense map."""
    maps = tb.get_json(f"run?run={urllib.parse.quote(run)}")["activity"]
    assert maps, f"{run}: no activity maps"
    p.open(f"p.introspect.run={urllib.parse.quote(run)}&p.introspect.tab=activity")
    p.check("activity maps", run)
    p.f.wait_for_function(AMAP_READY_JS, arg=None, timeout=60_000, polling=100)
    first = expected_default(maps)
    by_name = {m["name"]: m for m in maps}
    chosen = [first]
    # The widest map of each kind: spatial (most positions), then dense (most channels).
    spatial = [m for m in maps if m["positions"]]
    dense = [m for m in maps if not m["positions"]]
    for group, key in ((spatial, "positions"), (dense, "channels")):
        if group:
            pick = max(group, key=lambda m: (m[key], m["channels"]))["name"]
            if pick not in chosen:
                chosen.append(pick)
    for i, name in enumerate(chosen):
        if i:
            switch_layer(p, name)
            p.s.wait_url(f"p.introspect.alayer={urllib.parse.quote(name, safe='')}")
        doc = tb.get_json(
            f"activity?run={urllib.parse.quote(run)}&tag={urllib.parse.quote(by_name[name]['tag'])}")
        check_map_drawn(p, f"{run} {name}", doc, len(doc["epochs"]) - 1)
        if doc["positions"]:
            check_hover_readout(p, doc, len(doc["epochs"]) - 1, 0.5, 0.5)
            check_hover_readout(p, doc, len(doc["epochs"]) - 1, 0.02, 0.98)
        step_epochs(p, f"{run} {name}", doc)
    assert p.s.errors == [], p.s.errors


@pytest.mark.parametrize("run", [*DEMO_RUNS, APP_RUN])
def test_activity_maps_of_a_real_run(browser, real_tb, run):
    p = Probe(browser, real_tb, embedded=False)
    try:
        sweep_activity_maps(p, real_tb, run)
    finally:
        p.close()


def write_big_maps_run(logdir: Path, run: str = "big_maps", epochs: int = 12) -> None:
    """Maps of a 224x224 model's sizes: 112x112 positions, 1280 channels, a 500-long sequence.

    Output statistics of the browser fixture beside them; the maps have a dead border (padding)
    that grows with the epochs and dead channels, so every epoch draws differently.
    """
    import numpy as np

    outputs = [("stem", 0, (-1, 112, 112, 32)), ("tokens", 1, (-1, 500, 64)),
               ("head", 2, (-1, 7, 7, 1280)), ("logits", 3, (-1, 1000))]
    rng = np.random.default_rng(0)
    writer = NumpyWriter(logdir / run)
    for epoch in range(epochs):
        step = (epoch + 1) * 10
        summary = summary_pb2.Summary()
        for index, (name, depth, shape) in enumerate(outputs):
            summary.value.extend(summary_pb.tensor_stats_pb(
                stats_vector(run, "output", index, step, shape), view="output", name=name,
                layer=name, depth=depth, shape=shape).value)
            channels = rng.uniform(0.05, 0.95, shape[-1]) ** (1 + epoch / 4)
            channels[: shape[-1] // 10] = 0.0
            dims = shape[1:-1]
            if dims:
                grids = np.meshgrid(*[np.linspace(-1, 1, d) for d in dims], indexing="ij")
                radius = np.sqrt(sum(g**2 for g in grids))
                spatial = np.clip(1.0 - radius / 1.5 + 0.02 * epoch, 0.0, 1.0)
                border = 1 + epoch // 4
                edge = np.zeros(dims, dtype=bool)
                for axis, d in enumerate(dims):
                    idx = np.arange(d)
                    mask = (idx < border) | (idx >= d - border)
                    edge |= mask.reshape([-1 if a == axis else 1 for a in range(len(dims))])
                spatial[edge] = 0.0
                spatial = spatial.reshape(-1)
            else:
                spatial = np.empty(0)
            summary.value.extend(summary_pb.activity_pb(
                channels, spatial, name=name, samples=640, epoch=epoch, layer=name,
                depth=depth, shape=shape).value)
        writer.add_summary(summary, step, wall_time=1.7e9 + step)
    writer.close()


@pytest.fixture(scope="module")
def big_maps_tb(tmp_path_factory):
    root = tmp_path_factory.mktemp("big_maps") / "logs"
    write_big_maps_run(root)
    with tensorboard(root, reload=False) as server:
        yield server


def test_large_activity_maps_draw_without_long_tasks(browser, big_maps_tb):
    """112x112 positions (a 224x224 model's first layers), 1280 channels, a 500-long strip."""
    p = Probe(browser, big_maps_tb, embedded=False)
    try:
        sweep_activity_maps(p, big_maps_tb, "big_maps")
        # Every map of the run, including the 1-D strip the sweep may not pick.
        for name in ("stem", "tokens", "head", "logits"):
            if amap(p)["layer"] != name:
                switch_layer(p, name)
        assert p.s.errors == [], p.s.errors
    finally:
        p.close()


# -- format version 1 is still read and drawn -----------------------------------------------

FORMAT_V1 = Path(__file__).resolve().parents[1] / "data" / "format_v1"


@pytest.fixture(scope="module")
def v1_tb(tmp_path_factory):
    # A copy: TensorBoard's log goes beside the logdir, never into the repository.
    root = tmp_path_factory.mktemp("format_v1") / "logs"
    shutil.copytree(FORMAT_V1 / "adam_cnn", root / "adam_cnn")
    with tensorboard(root, reload=False) as server:
        yield server


def test_format_v1_run_opens_every_view_and_has_no_activity_map(browser, v1_tb):
    listed = {r["run"]: r for r in v1_tb.get_json("runs")["runs"]}["adam_cnn"]
    assert listed["format_version"] == 1
    doc = v1_tb.get_json("run?run=adam_cnn")
    assert doc["activity"] == [] and all(t["activity_tag"] is None
                                         for t in doc["views"]["output"])
    views = tuple(v for v in slots.VIEWS if listed["views"].get(v))
    assert "output" in views, listed
    p = Probe(browser, v1_tb, embedded=False)
    try:
        p.open("p.introspect.run=adam_cnn")
        p.check("overview", "adam_cnn")
        p.sweep_layers("adam_cnn", views)
        p.act(lambda: p.f.locator('.tab[data-tab="activity"]').click())
        if p.f.locator("select.view-select").input_value() != "output":
            p.act(lambda: p.f.locator("select.view-select").select_option("output"))
        p.check("activity", "adam_cnn")
        state = amap(p)
        assert state["state"] == "none" and state["charts"] == [], state
        assert "No activity maps in run “adam_cnn”" in state["text"], state["text"]
        assert "format version 1" in state["text"], state["text"]
        p.act(lambda: p.f.locator('.tab[data-tab="compare"]').click())
        p.check("compare", "adam_cnn")
    finally:
        p.close()


# -- the implicit learning rate ------------------------------------------------------------

ILR_CHARTS = ("variable-ilr-bands", "variable-ilr-layers")


def test_overview_ilr_row_of_the_healthy_demo_run(browser, real_tb):
    """The row draws; its readout is the document's median; a click on a line opens the layer."""
    run = "1_healthy_cnn"
    v = real_tb.get_json(f"overview?run={run}")["views"]["variable"]
    ilr = v["ilr"]
    mid = ilr["band_quantiles"].index(50)
    p = Probe(browser, real_tb, embedded=False)
    try:
        p.open(f"p.introspect.run={run}")
        p.check("overview", run)
        for name in ILR_CHARTS:
            (pixels,) = p.f.evaluate(COLOURED_PIXELS_JS, f'.chart[data-chart="{name}"] canvas')
            assert pixels > MIN_PIXELS, name
        bands = p.f.locator(f'.chart[data-chart="{ILR_CHARTS[0]}"]')
        pairs = readout_pairs(bands)
        assert pairs["@"].startswith(f"step {v['steps'][-1]} "), pairs
        median = float(pairs["median"])
        assert median == pytest.approx(ilr["band"][mid][-1], rel=1e-5)
        # SGD with momentum m: over a window of logged steps the velocity sums to
        # (G + m (v_first - v_last)) / (1 - m), G the window's gradient sum, so the ILR is
        # lr / (1 - m) but for the momentum carried across the window's two ends (0.7 to 1.25
        # times lr / (1 - m) over seeds 0 to 6 of this run). What the row must show is the
        # momentum's gain: every layer at every point nearer lr / (1 - m) than lr on the log
        # axis, a factor sqrt(1 / (1 - m)) ≈ 3.2 either side: far outside what any seed gave.
        effective = HEALTHY_LR / (1.0 - MOMENTUM)
        low, high = HEALTHY_LR / math.sqrt(1.0 - MOMENTUM), effective / math.sqrt(1.0 - MOMENTUM)
        assert low < median < high, (median, effective)
        medians = [m for row in ilr["median"] for m in row]
        assert medians and all(m is not None and low < m < high for m in medians), medians

        # Hover: down the plot until the cursor meets a line and the readout names its layer.
        lines = p.f.locator(f'.chart[data-chart="{ILR_CHARTS[1]}"]')
        names = {e["layer"]: e["tag"] for e in ilr["layers"]}
        named = None
        for k in range(1, 60):
            p.s.hover(lines, 0.5, k / 60)
            found = lines.locator(".readout .layer-name")
            if found.count():
                named = found.text_content()
                break
        assert named in names, named
        assert "median ILR" in readout_pairs(lines)
        p.act(lambda: p.s.page.mouse.down() or p.s.page.mouse.up())
        assert p.f.locator(".tab.on").text_content() == "Layers"
        focused = p.f.locator(".panel.focused")
        assert focused.get_attribute("data-tag") == names[named]
        assert focused.get_attribute("data-drawn") == "ilr"
        p.check("layers after a click on an ILR line", run)
    finally:
        p.close()


def test_format_v1_run_has_no_implicit_learning_rate(browser, v1_tb):
    """Version-1 data has no ILR slots: the row says so, the mode is not offered (not even from
    the URL), and the magnitude mode shows the converted sign balance beside the zeros."""
    p = Probe(browser, v1_tb, embedded=False)
    try:
        p.open("p.introspect.run=adam_cnn")
        p.check("overview", "adam_cnn")
        note = p.f.locator("#sec-ilr .empty")
        assert "No implicit learning rate in this run" in note.text_content()
        assert p.f.locator("#sec-ilr canvas").count() == 0

        p.s.page.goto("about:blank")  # a hash-only change would not load the page again
        p.open("p.introspect.run=adam_cnn&p.introspect.tab=layers&p.introspect.view=variable"
               "&p.introspect.lmode=ilr")
        p.check("layers variable, ilr asked", "adam_cnn")
        assert p.f.locator('.segmented button[data-mode="ilr"]').count() == 0
        modes = p.f.locator(".panel").evaluate_all("ps => ps.map((x) => x.dataset.drawn)")
        assert modes and set(modes) == {"values"}, modes

        p.s.page.goto("about:blank")
        p.open("p.introspect.run=adam_cnn&p.introspect.tab=layers&p.introspect.view=output"
               "&p.introspect.lmode=magnitude")
        p.check("layers output magnitude", "adam_cnn")
        # The ReLU conv output: v1 wrote +53 % (zeros counted); read as version 2, +100 %.
        conv = p.f.locator('.panel[data-tag="introspect/output/conv"]')
        pairs = readout_pairs(conv)
        assert pairs["sign"] == "+100.0%" and pairs["zeros"] == "49.2%", pairs
    finally:
        p.close()
