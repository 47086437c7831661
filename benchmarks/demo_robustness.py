"""Do the demo's stories hold on any x86 machine? Train the quick demo of every framework
for every seed, thread count and emulated kernel path, and judge every run.

    python benchmarks/demo_robustness.py                       # the whole matrix
    python benchmarks/demo_robustness.py --frameworks torch --seeds 0 1 --jobs 2
    python benchmarks/demo_robustness.py --cells torch/aten-avx2/seed1/2t keras/onednn-off/seed3/1t

A cell is one ``tb-introspect demo --quick`` (all four scenarios, or those of ``--scenarios``)
in a fresh process; ``--jobs`` cells run at a time (each with its own thread count). A
scenario's entry in the table is the number of cells where it told its story with margin
(``tb_introspect.demo.robustness``), out of the cells run; every failure is listed with its
reasons below it. Exits 1 when any cell fails.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed

from tb_introspect.demo.models import scenario_names
from tb_introspect.demo.robustness import PATHS, SEEDS, THREADS, Cell, Outcome, matrix, run_cell


def _table(outcomes: list[Outcome], scenarios: list[str]) -> str:
    """Markdown: one row per framework and scenario, one column per kernel path."""
    ran = {o.cell.framework for o in outcomes}
    paths = [(f, p) for f in PATHS if f in ran for p in PATHS[f]]
    lines = ["| framework | scenario | " + " | ".join(p for _, p in paths) + " |",
             "|---|---|" + "---|" * len(paths)]
    for framework in PATHS:
        for name in scenarios:
            cells = []
            for f, p in paths:
                runs = [o for o in outcomes if o.cell.framework == f == framework
                        and o.cell.path == p]
                if not runs:
                    cells.append("")
                    continue
                good = sum(not o.error and not o.problems.get(name, ["missing"]) for o in runs)
                cells.append(f"{good}/{len(runs)}" + (" ✓" if good == len(runs) else " ✗"))
            if any(cells):
                lines.append(f"| {framework} | {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--frameworks", nargs="+", default=list(PATHS), choices=list(PATHS))
    ap.add_argument("--seeds", nargs="+", type=int, default=list(SEEDS))
    ap.add_argument("--threads", nargs="+", type=int, default=list(THREADS))
    ap.add_argument("--cells", nargs="+", metavar="LABEL",
                    help="only these cells (framework/path/seedN/Nt), instead of the matrix")
    ap.add_argument("--scenarios", nargs="+", default=scenario_names(),
                    choices=scenario_names(), help="the scenarios each cell trains (default all)")
    ap.add_argument("--jobs", type=int, default=2, help="cells run at a time (default 2)")
    ap.add_argument("--json", help="also write every cell's outcome to this file")
    args = ap.parse_args(argv)

    try:
        cells = ([Cell.parse(label) for label in args.cells] if args.cells
                 else matrix(args.frameworks, args.seeds, args.threads))
    except ValueError as e:
        ap.error(str(e))
    print(f"{len(cells)} cells, {args.jobs} at a time", flush=True)
    start = time.perf_counter()
    outcomes: list[Outcome] = []
    with ThreadPoolExecutor(args.jobs) as pool:
        scenarios = () if args.scenarios == scenario_names() else args.scenarios
        futures = [pool.submit(run_cell, c, scenarios=scenarios) for c in cells]
        for n, fut in enumerate(as_completed(futures), start=1):
            o = fut.result()
            outcomes.append(o)
            state = "ok" if o.ok else "FAIL"
            print(f"[{n}/{len(cells)}] {o.cell.label}: {state} ({o.seconds:.0f} s)", flush=True)
    minutes = (time.perf_counter() - start) / 60
    print()
    print(_table(outcomes, args.scenarios))
    print(f"\n{len(cells)} cells in {minutes:.1f} min")
    failed = [o for o in outcomes if not o.ok]
    for o in sorted(failed, key=lambda o: o.cell.label):
        print(f"\n{o.cell.label}:")
        if o.error:
            print("  the demo failed: " + o.error.strip().replace("\n", "\n    "))
        for name, problems in o.problems.items():
            for p in problems:
                print(f"  {name}: {p}\n    {o.numbers.get(name, '')}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{"cell": o.cell.label, "seconds": o.seconds, "error": o.error,
                        "problems": o.problems, "numbers": o.numbers,
                        "kinds": {k: sorted(v) for k, v in o.kinds.items()}}
                       for o in outcomes], f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
