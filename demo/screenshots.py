"""Screenshots of the Introspect tab for the README, from a demo logdir.

    python demo/screenshots.py logs/demo docs/images

Starts a real TensorBoard on LOGDIR (no TensorFlow needed) and saves the
Overview of each demo run as seen in headless Chromium (/usr/bin/chromium).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import browser_support as bs  # noqa: E402
from playwright.sync_api import sync_playwright  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logdir", type=Path)
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--height", type=int, default=2600, help="viewport height in pixels")
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
        browser.close()


if __name__ == "__main__":
    main()
