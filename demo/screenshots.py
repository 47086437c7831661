"""Screenshots of the Introspect tab for the README and docs/reading-the-tab.md, from a demo logdir.

    python demo/screenshots.py logs/demo docs/images

Starts a real TensorBoard on LOGDIR (no TensorFlow needed) and saves, as seen in
headless Chromium (/usr/bin/chromium), for each demo run:

* ``overview-<run>.png``: the whole Overview;
* ``<run>-<chart>.png``: single charts of the Overview (``CHARTS``) and the findings
  panel, for the chart-by-chart guide. ``--no-charts`` skips them.

``<run>`` is the run name without its ``N_`` prefix (``healthy_cnn``).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import browser_support as bs  # noqa: E402
from playwright.sync_api import sync_playwright  # noqa: E402

#: data-chart names of the Overview charts shot one by one.
CHARTS = (
    "metric-loss",
    "metric-val_loss",
    "gradient-rms-bands",
    "gradient-stack",
    "variable-stack",
    "output-activity",
)


def short_name(run: str) -> str:
    """``2_lr_too_high_cnn`` -> ``lr_too_high_cnn``."""
    return re.sub(r"^\d+_", "", run)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logdir", type=Path)
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--height", type=int, default=2600, help="viewport height in pixels")
    parser.add_argument("--no-charts", action="store_true", help="only the whole Overview")
    args = parser.parse_args()
    args.outdir.mkdir(parents=True, exist_ok=True)
    runs = sorted(p.name for p in args.logdir.iterdir() if p.is_dir())
    with bs.tensorboard(args.logdir, wait_runs=len(runs)) as tb, sync_playwright() as p:
        browser = bs.launch_chromium(p)
        page = browser.new_page(viewport={"width": 1400, "height": args.height})
        for run in runs:
            page.goto(tb.url + "#introspect")
            frame = bs.plugin_frame(page)
            frame.wait_for_selector("select")
            frame.select_option("select", label=run)
            # Charts draw after the overview arrives; wait until the findings panel is filled.
            frame.wait_for_function(
                "() => document.body.innerText.includes('Findings')", timeout=120_000
            )
            page.wait_for_timeout(3000)
            path = args.outdir / f"overview-{run}.png"
            page.screenshot(path=str(path))
            print(path)
            if args.no_charts:
                continue
            stem = short_name(run)
            shots = [(f'.chart[data-chart="{c}"]', c) for c in CHARTS]
            shots.append(("section.findings", "findings"))
            for selector, label in shots:
                el = frame.locator(selector)
                if el.count() != 1:
                    continue  # e.g. no val_loss logged in this run
                path = args.outdir / f"{stem}-{label}.png"
                el.screenshot(path=str(path))
                print(path)
        browser.close()


if __name__ == "__main__":
    main()
