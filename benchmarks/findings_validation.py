"""The findings' validation table: every scenario of ``tests/diagnose/findings_archs.py`` trained
once, and every scenario of ``tests/diagnose/findings_pairs.py`` (bugs a healthy run shares a
symptom with, and their healthy twins) trained with Keras (``model.fit`` with ``Introspect``)
and with PyTorch (the ``Introspector``), the logdir read back after every epoch as a live tab
would, and for each run what fired, at which epoch, against the onset.

Usage: python benchmarks/findings_validation.py [--only NAME ...] [--epochs N]
       [--pairs-only | --archs-only]

Prints the Markdown table of docs/findings.md ("Validation"): for a pathology, the epoch at
which the live reading first shows each expected finding (at its severity) against the
onset read off the curves; for a healthy run, every warning any live reading showed (the
target is none). The final findings of each run follow (warning and critical ones, with
their first epoch). ``tests/diagnose/test_findings_archs.py`` asserts the same on the same runs.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main(argv: list[str] | None = None) -> None:
    from tests.diagnose.findings_archs import SCENARIOS, train_scenario
    from tests.diagnose.findings_pairs import PAIRS, train_pair

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", nargs="*", default=None, help="scenario names")
    p.add_argument("--epochs", type=int, default=None, help="override each scenario's epochs")
    p.add_argument("--pairs-only", action="store_true", help="the findings_pairs runs only")
    p.add_argument("--archs-only", action="store_true", help="the findings_archs runs only")
    args = p.parse_args(argv)
    names = [] if args.pairs_only else [n for n in (args.only or SCENARIOS) if n in SCENARIOS]
    rows = []
    t0 = time.perf_counter()
    for name in names:
        sc = SCENARIOS[name]
        with tempfile.TemporaryDirectory() as d:
            t = time.perf_counter()
            r = train_scenario(name, d, epochs=args.epochs)
            secs = time.perf_counter() - t
        final = ", ".join(f"{f.severity} `{f.kind}` ({f.first_epoch})" for f in r.findings
                          if f.severity != "info") or "none"
        if sc.healthy:
            live = r.serious_live()
            verdict = ("no warning at any epoch" if not live else
                       "; ".join(f"{k} at epoch {e}" for e, k, _ in live))
            rows.append((name, sc.note or "healthy", "-", "-", verdict, final, secs))
        else:
            for kind, (severity, _) in sc.expect.items():
                first = r.first_epoch_with(kind, severity)
                rows.append((name, sc.note, f"{severity} `{kind}`", str(sc.onset(kind, r.run)),
                             "never" if first is None else str(first), final, secs))
        print(f"{name}: {secs:.1f} s", file=sys.stderr)
    pairs = [] if args.archs_only else [n for n in (args.only or PAIRS) if n in PAIRS]
    for name in pairs:
        pc = PAIRS[name]
        for fw in pc.frameworks:
            with tempfile.TemporaryDirectory() as d:
                t = time.perf_counter()
                r = train_pair(name, fw, d)
                secs = time.perf_counter() - t
            final = ", ".join(f"{f.severity} `{f.kind}` ({f.first_epoch})" for f in r.findings
                              if f.severity != "info") or "none"
            label = f"{name} ({fw})"
            if pc.healthy:
                live = r.serious_live()
                verdict = ("no warning at any epoch" if not live else
                           "; ".join(f"{k} at epoch {e}" for e, k, _ in live))
                rows.append((label, f"twin: {pc.note}", "-", "-", verdict, final, secs))
            else:
                for kind, (severity, _) in pc.expect.items():
                    first = r.first_epoch_with(kind, severity)
                    rows.append((label, pc.note, f"{severity} `{kind}`",
                                 str(pc.onset(kind, r.run)),
                                 "never" if first is None else str(first), final, secs))
            print(f"{label}: {secs:.1f} s", file=sys.stderr)
    print("| scenario | what | expected | onset | live: first epoch shown | final warnings"
          " (first epoch) |")
    print("|---|---|---|---|---|---|")
    for name, note, exp, onset, first, final, _ in rows:
        print(f"| {name} | {note} | {exp} | {onset} | {first} | {final} |")
    n_runs = len(names) + sum(len(PAIRS[n].frameworks) for n in pairs)
    print(f"\n{n_runs} runs, {time.perf_counter() - t0:.0f} s wall", file=sys.stderr)


if __name__ == "__main__":
    main()
