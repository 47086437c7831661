"""Time the Introspect tab in headless Chromium on the 200-tensor benchmark run.

Writes (or reuses, --logdir) one run with N monitored tensors x 4 views x S
steps (the writer of benchmarks/plugin_bench.py), starts a real ``tensorboard``
(Rust data server by default), waits until every point is loaded, then opens
TensorBoard's page in Debian's Chromium and measures, inside the plugin iframe:

- overview: from the iframe's navigation start until every overview chart is
  drawn (the app marks ``data-status=ready`` after uPlot's commit and two
  animation frames), i.e. what a user waits for after clicking the tab;
- layers grid: from the click on "Layers" until every panel on screen (and a
  screen around it) of the gradient view is drawn; their tags are read first
  (default modes: magnitude percentiles + sign balance); the other panels'
  data follows and they are drawn in idle time, "all panels drawn" is when the
  last one is. With each, the CPU time the browser's renderer spent (a figure
  that, unlike wall time, hardly depends on other load on the machine).

Each is measured on a fresh page (nothing cached in the browser). "first" is
the first page after TensorBoard started; "warm" is the median of --repeats
later pages. "after a data change" opens a fresh page on the Overview, or
directly on Layers, right after one point was appended to the run and
TensorBoard listed it: the server's caches are stale and the run's sample is
read again (the first-screen targets). Every canvas is checked for
drawn data when the app says it is ready. Prints a Markdown table.

    python benchmarks/frontend_bench.py                    # 200 x 4 x 1,000
    python benchmarks/frontend_bench.py --tensors 20 --steps 100 --repeats 2
    python benchmarks/frontend_bench.py --preset 5m        # 195 x 4 x 6,400 = 5M points
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))  # the repository: the tests package

from playwright.sync_api import sync_playwright  # noqa: E402
from plugin_bench import PRESETS, touch_run, write_bench_run  # noqa: E402

from tests.browser.browser_support import launch_chromium, plugin_frame, tensorboard  # noqa: E402

TARGETS_MS = {"overview": 1500, "layers grid": 2000, "layers, all panels drawn": 2000,
              "cold overview": 1500, "cold layers": 1500}

COLOURED_JS = """
() => Array.from(document.querySelectorAll('.chart canvas')).map((c) => {
  const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  let n = 0;
  for (let i = 0; i < d.length; i += 16) {
    if (Math.max(d[i], d[i + 1], d[i + 2]) - Math.min(d[i], d[i + 1], d[i + 2]) > 40) n++;
  }
  return n;
})
"""


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        for c in children.get(pid, []):
            out.append(c)
            todo.append(c)
    return out


def renderer_cpu_s() -> float:
    """CPU seconds used so far by our Chromium's renderer processes (Linux /proc).

    Unlike wall time this barely depends on what else the machine runs, so it
    is the figure to compare between runs on a shared machine.
    """
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for pid in _descendants(os.getpid()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"--type=renderer" not in f.read():
                    continue
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except (OSError, ValueError, IndexError):
            continue
    return total


def wait_loaded(tb, run: str, tensors: int, steps: int, timeout: float = 3600.0,
                poll: float = 2.0) -> float:
    t = time.monotonic()
    while True:
        try:
            info = tb.get_json(f"run?run={run}")
            listed = [x for v in info["views"].values() for x in v]
            # num_points is null past the server's sample; the last step is exact.
            if len(listed) == tensors and all(x["last_step"] == steps - 1 for x in listed):
                return time.monotonic() - t
        except OSError:
            pass
        if time.monotonic() - t > timeout:
            raise TimeoutError("TensorBoard did not load the benchmark run")
        time.sleep(poll)


def measure_once(browser, tb, tensors: int) -> dict[str, float]:
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("console", lambda m: m.type == "error" and errors.append(m.text))
    try:
        page.goto(tb.url + "#introspect&p.introspect.run=bench")
        frame = plugin_frame(page, 60)
        frame.wait_for_selector("html[data-status=ready]", timeout=120_000)
        overview_ms = float(frame.evaluate("document.querySelector('main').dataset.readyAt"))
        drawn = frame.evaluate(COLOURED_JS)
        # Every chart the page laid out has its canvas, with data drawn (the count comes
        # from the page: new Overview rows must not break the benchmark).
        charts = frame.evaluate("document.querySelectorAll('.chart').length")
        assert charts and len(drawn) == charts and min(drawn) > 0, \
            f"overview not fully drawn: {len(drawn)} canvases of {charts} charts: {drawn}"

        page.wait_for_timeout(300)  # let the overview's last frames settle
        cpu0 = renderer_cpu_s()
        frame.locator('.tab[data-tab="layers"]').click()
        frame.wait_for_selector("html[data-status=ready]", timeout=120_000)
        cpu_ms = (renderer_cpu_s() - cpu0) * 1000
        layers_ms = float(frame.evaluate("document.querySelector('main').dataset.renderMs"))
        # Offscreen panels are drawn in idle time after that (lazy.js): wait for the last.
        frame.wait_for_selector("main[data-complete-ms]", timeout=120_000)
        all_ms = float(frame.evaluate("document.querySelector('main').dataset.completeMs"))
        cpu_all_ms = (renderer_cpu_s() - cpu0) * 1000
        drawn = frame.evaluate(COLOURED_JS)
        assert len(drawn) == tensors and min(drawn) > 0, f"layers not fully drawn: {len(drawn)}"
        assert not errors, errors
        return {"overview": overview_ms, "layers grid": layers_ms,
                "layers: renderer CPU": cpu_ms, "layers, all panels drawn": all_ms,
                "layers, all panels: renderer CPU": cpu_all_ms}
    finally:
        context.close()


FINDINGS_AT = """() => { const b = document.querySelector('#findings[data-state=ready]');
  return b ? parseFloat(b.dataset.readyAt) : null; }"""


def measure_cold(browser, tb, run_dir: Path, steps: int, tab: str) -> tuple[float, float | None]:
    """ms from the iframe's navigation to ``tab`` drawn, first time after a data change, and
    (Overview) to its findings shown: read after the charts when they come from view
    summaries."""
    step = max(steps, tb.get_json("runs")["runs"][0]["max_step"] + 1)
    touch_run(str(run_dir), step)
    deadline = time.monotonic() + 600
    while tb.get_json("runs")["runs"][0]["max_step"] < step:
        if time.monotonic() > deadline:
            raise TimeoutError("TensorBoard did not list the appended point")
        time.sleep(0.2)
    time.sleep(1.2)  # past the plugin's listing reuse window
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("console", lambda m: m.type == "error" and errors.append(m.text))
    try:
        page.goto(tb.url + f"#introspect&p.introspect.run=bench&p.introspect.tab={tab}")
        frame = plugin_frame(page, 60)
        frame.wait_for_selector("html[data-status=ready]", timeout=300_000)
        ms = float(frame.evaluate("document.querySelector('main').dataset.readyAt"))
        drawn = frame.evaluate(COLOURED_JS)
        assert drawn and min(drawn) > 0, f"{tab}: not drawn: {drawn}"
        findings = None
        if tab == "overview":
            frame.wait_for_function(FINDINGS_AT, timeout=600_000)
            findings = frame.evaluate(FINDINGS_AT)
        assert not errors, errors
        return ms, findings
    finally:
        context.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tensors", type=int, default=200)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--load-fast", default="true", help="TensorBoard --load_fast value")
    parser.add_argument("--cold", type=int, default=3,
                        help="pages opened right after a data change, per tab")
    parser.add_argument("--preset", choices=sorted(PRESETS),
                        help="5m: 195 tensors x 4 views x 6,400 steps (sets --tensors/--steps)")
    parser.add_argument("--logdir", help="reuse/keep this logdir (default: a temporary one)")
    parser.add_argument("--poll", type=float, default=2.0,
                        help="seconds between checks while TensorBoard loads the run (each"
                             " check reads the run's sample)")
    args = parser.parse_args(argv)
    if args.preset:
        args.tensors, args.steps = PRESETS[args.preset]

    logdir = Path(args.logdir or tempfile.mkdtemp(prefix="introspect-fe-bench-"))
    run_dir = logdir / "bench"
    try:
        if not run_dir.is_dir():
            t = time.perf_counter()
            write_bench_run(str(run_dir), args.tensors, args.steps)
            print(f"wrote the run in {time.perf_counter() - t:.1f} s", file=sys.stderr)
        with tensorboard(logdir, extra_args=(f"--load_fast={args.load_fast}",)) as tb:
            load_s = wait_loaded(tb, "bench", 4 * args.tensors, args.steps, poll=args.poll)
            print(f"TensorBoard loaded every point in {load_s:.1f} s", file=sys.stderr)
            with sync_playwright() as p:
                browser = launch_chromium(p)
                runs = [measure_once(browser, tb, args.tensors) for _ in range(args.repeats + 1)]
                # Alternated, so that a trend in the machine's load hits both alike.
                cold: dict[str, list[float]] = {"cold overview": [], "cold findings": [],
                                                "cold layers": []}
                for _ in range(args.cold):
                    for tab in ("overview", "layers"):
                        ms, findings = measure_cold(browser, tb, run_dir, args.steps, tab)
                        cold[f"cold {tab}"].append(ms)
                        if findings is not None:
                            cold["cold findings"].append(findings)
                browser.close()
    finally:
        if not args.logdir:
            shutil.rmtree(logdir, ignore_errors=True)

    print(f"\n{args.tensors} tensors x 4 views x {args.steps} steps, headless Chromium "
          f"1400x900, {os.cpu_count()} CPUs (load average {os.getloadavg()[0]:.1f}); "
          f"first = first page after TensorBoard started, warm = median of {args.repeats} "
          "fresh pages\n")
    print("| what | first (ms) | warm median (ms) | target (ms) |")
    print("|---|---:|---:|---:|")
    labels = {
        "overview": "overview, all charts drawn",
        "layers grid": "layers grid, first screen drawn (its panels' data read first)",
        "layers: renderer CPU": "  renderer CPU for it",
        "layers, all panels drawn": f"layers grid, all {args.tensors} panels drawn",
        "layers, all panels: renderer CPU": "  renderer CPU for it",
    }
    for key, label in labels.items():
        first = runs[0][key]
        warm = statistics.median(r[key] for r in runs[1:]) if len(runs) > 1 else float("nan")
        print(f"| {label} | {first:.0f} | {warm:.0f} | {TARGETS_MS.get(key, '')} |")
    for key, label in (("cold overview", "overview, first page after a data change"),
                       ("cold findings", "  its findings shown"),
                       ("cold layers", "layers first screen, first page after a data change")):
        if cold[key]:
            print(f"| {label} (median of {len(cold[key])}) | {statistics.median(cold[key]):.0f}"
                  f" | — | {TARGETS_MS.get(key, '')} |")


if __name__ == "__main__":
    main()
