"""Screenshots of the Introspect tab for the README and docs/reading-the-tab.md, from a demo logdir.

    python demo/screenshots.py logs/demo docs/images

Starts a real TensorBoard on LOGDIR (no TensorFlow needed) and saves, as seen in
headless Chromium (/usr/bin/chromium), for each demo run:

* ``overview-<run>.png``: the whole Overview;
* ``<run>-<chart>.png``: single charts of the Overview (``CHARTS``) and the findings
  panel, for the chart-by-chart guide. ``--no-charts`` skips them;
* ``<run>-layers-<view>-<mode>.png``: the Layers grid of a view in one mode (``LAYER_MODES``);
* ``<run>-activity-map.png``: the Activity view's per-channel and spatial activity of the layer
  it opens (the highest final dead rate), and ``<run>-activity-map-<layer>.png`` of the layers
  in ``MAP_LAYERS`` the run has.

``--only NAME ...`` saves only the images whose ``<chart>`` or ``layers-<view>-<mode>`` part
is listed (and not the whole Overview), so that adding a chart regenerates only its images.

``<run>`` is the run name without its ``N_`` prefix (``healthy_cnn``).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

# The repository root, not tests/: tests/torch would shadow the real torch package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from playwright.sync_api import sync_playwright  # noqa: E402

from tests.browser import browser_support as bs  # noqa: E402

#: data-chart names of the Overview charts shot one by one.
CHARTS = (
    "metric-loss",
    "metric-val_loss",
    "gradient-rms-bands",
    "gradient-stack",
    "variable-stack",
    "output-activity",
    "variable-ilr-bands",
    "variable-ilr-layers",
)

#: (view, mode) of the Layers grids shot whole.
LAYER_MODES = (("variable", "ilr"), ("output", "magnitude"))

#: Layer outputs whose activity map is shot besides the one the section opens.
MAP_LAYERS = ("conv1", "upsample")

# True once every panel of the grid has its chart (off-screen ones draw in idle time).
ALL_DRAWN_JS = """
() => [...document.querySelectorAll('.panel')].every((p) => p.querySelector('.chart canvas'))
"""


def short_name(run: str) -> str:
    """``2_lr_too_high_cnn`` -> ``lr_too_high_cnn``."""
    return re.sub(r"^\d+_", "", run)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logdir", type=Path)
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--height", type=int, default=2600, help="viewport height in pixels")
    parser.add_argument("--no-charts", action="store_true", help="only the whole Overview")
    parser.add_argument("--only", nargs="+", metavar="NAME",
                        help="only these charts / layers-<view>-<mode> grids")
    args = parser.parse_args()
    wanted = (lambda label: label in args.only) if args.only else (lambda label: True)
    args.outdir.mkdir(parents=True, exist_ok=True)
    runs = sorted(p.name for p in args.logdir.iterdir() if p.is_dir())
    with bs.tensorboard(args.logdir, wait_runs=len(runs)) as tb, sync_playwright() as p:
        browser = bs.launch_chromium(p)
        page = browser.new_page(viewport={"width": 1400, "height": args.height})
        for run in runs:
            page.goto("about:blank")  # the last run's Layers grid left the hash elsewhere
            page.goto(tb.url + "#introspect")
            frame = bs.plugin_frame(page)
            frame.wait_for_selector("select")
            frame.select_option("select", label=run)
            # Charts draw after the overview arrives; wait until the findings panel is filled.
            frame.wait_for_function(
                "() => document.body.innerText.includes('Findings')", timeout=120_000
            )
            page.wait_for_timeout(3000)
            if not args.only:
                path = args.outdir / f"overview-{run}.png"
                page.screenshot(path=str(path))
                print(path)
            if args.no_charts:
                continue
            stem = short_name(run)
            shots = [(f'.chart[data-chart="{c}"]', c) for c in CHARTS]
            shots.append(("section.findings", "findings"))
            for selector, label in shots:
                if not wanted(label):
                    continue
                el = frame.locator(selector)
                if el.count() != 1:
                    continue  # e.g. no val_loss logged in this run
                path = args.outdir / f"{stem}-{label}.png"
                el.screenshot(path=str(path))
                print(path)
            for view, mode in LAYER_MODES:
                label = f"layers-{view}-{mode}"
                if wanted(label):
                    path = args.outdir / f"{stem}-{label}.png"
                    print(shoot_layers(page, tb.url, run, view, mode, path))
            for layer in (None, *MAP_LAYERS):
                label = "activity-map" + (f"-{layer}" if layer else "")
                if wanted(label):
                    path = args.outdir / f"{stem}-{label}.png"
                    shot = shoot_activity_map(page, tb.url, run, layer, path)
                    print(shot or f"({run}: no {label})")
        browser.close()


def shoot_layers(page, url: str, run: str, view: str, mode: str, path: Path) -> Path:
    """The Layers grid of ``view`` with every panel in ``mode``."""
    page.goto("about:blank")  # a hash-only change would not load the tab again
    page.goto(f"{url}#introspect&p.introspect.run={run}&p.introspect.tab=layers"
              f"&p.introspect.view={view}&p.introspect.lmode={mode}")
    frame = bs.plugin_frame(page)
    frame.wait_for_selector("html[data-status=ready]", timeout=120_000)
    frame.wait_for_function(ALL_DRAWN_JS, timeout=120_000, polling=200)
    page.wait_for_timeout(1000)
    frame.locator(".grid").screenshot(path=str(path))
    return path


def shoot_activity_map(page, url: str, run: str, layer: str | None, path: Path) -> Path | None:
    """The Activity view's per-channel and spatial activity of ``layer`` (None: the one it
    opens); None when the run has no map of that layer."""
    page.goto("about:blank")
    page.goto(f"{url}#introspect&p.introspect.run={run}&p.introspect.tab=activity"
              f"&p.introspect.aview=output" + (f"&p.introspect.alayer={layer}" if layer else ""))
    frame = bs.plugin_frame(page)
    frame.wait_for_selector("html[data-status=ready]", timeout=120_000)
    section = frame.locator("section.amap")
    if section.get_attribute("data-state") != "ready" or (
            layer and section.get_attribute("data-layer") != layer):
        return None  # no maps, or the layer is not in this run (the section opened another)
    page.wait_for_timeout(500)
    section.screenshot(path=str(path))
    return path


if __name__ == "__main__":
    main()
