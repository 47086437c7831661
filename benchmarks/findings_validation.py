"""The findings' validation table: every scenario of ``tests/diagnose/findings_archs.py`` trained
once, and every scenario of ``tests/diagnose/findings_pairs.py`` (bugs a healthy run shares a
symptom with, and their healthy twins) trained with Keras (``model.fit`` with ``Introspect``)
and with PyTorch (the ``Introspector``), the logdir read back after every epoch as a live tab
would, and for each run what fired, at which epoch, against the onset.

Usage: python benchmarks/findings_validation.py [--only NAME ...] [--epochs N]
       [--pairs-only | --archs-only]
       python benchmarks/findings_validation.py --transformers [--seeds 0 1 2 3]
       [--frameworks torch keras hf] [--threads N]
       python benchmarks/findings_validation.py --defaults [--only ARCH ...] [--speeds 1 3 0.333]
       python benchmarks/findings_validation.py --healthy [--only NAME ...] [--threads N]

Prints the Markdown table of docs/findings.md ("Validation"): for a pathology, the epoch at
which the live reading first shows each expected finding (at its severity) against the
onset read off the curves; for a healthy run, every warning any live reading showed (the
target is none). The final findings of each run follow (warning and critical ones, with
their first epoch). ``tests/diagnose/test_findings_archs.py`` asserts the same on the same runs.

``--transformers`` prints instead the table of docs/findings.md ("Transformer instabilities:
validation"): the small GPTs of ``tb_introspect/demo/gpt.py`` (a plain PyTorch loop with the
``Introspector``, Keras ``fit`` with ``Introspect``, the tiny GPT-2 under the Hugging Face
``Trainer`` with ``IntrospectCallback()``), each story at each seed: the step its loss diverged
(``gpt.diverged_at``), the largest attention logit (the model's own measurement at every
step, and the probes'), the step each transformer finding first fired (its ``first_step``,
read from the finished run), the step training was at when ``on_finding`` saw it, and the
other warnings. ``tests/diagnose/test_findings_transformer.py`` asserts the same at seed 0.

``--defaults`` prints the table of docs/findings.md ("At the trainers' defaults"): Hugging
Face ``Trainer`` runs at the callback's defaults (``IntrospectCallback()``: ``every="auto"``,
its windows paced by ``overhead``, the probe points at the planned cadence;
docs/options.md) with ``on_finding`` recording the live step, on three architectures
(``DEFAULTS``: the tiny pre-LN GPT-2, a post-LN OPT, a stock Llama trained with gradient
accumulation), each at its unstable rate and its low-rate twin, and each with the step as
the governor sees it at its own speed, 3x slower and 3x faster (its clock scaled: the
pacing changes, the verdict must not). Per run: the divergence, the points and probe
points written, the window the pacing ended on, the transformer findings' first steps (in
the finished run) and live steps, and how many steps the first came before the divergence.

``--healthy`` trains the healthy corpus of ``tests/diagnose/findings_healthy.py`` (Keras,
PyTorch loops, the Hugging Face ``Trainer`` and Lightning; classifiers and language models
trained to their floor) and prints the table of docs/findings.md ("The healthy corpus"):
per run where it ended, every warning or critical any live reading showed (the target is
none), and the info findings of the finished run; then the count of runs and warnings.
``tests/diagnose/test_findings_healthy.py`` asserts a few of them in ``make test``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


#: The findings that say a transformer is going unstable.
TRANSFORMER_KINDS = ("attention_logit_growth", "output_logit_drift", "update_spike",
                     "loss_spike")


def _transformer_run(framework: str, story: str, seed: int, logdir: str):
    """Train one GPT story; its history and its run's findings."""
    from pathlib import Path

    from tb_introspect.demo import gpt
    from tb_introspect.diagnose import find_issues
    from tb_introspect.read import read_logdir
    from tb_introspect.read.series import probes_of

    if framework == "torch":
        history = gpt.train(gpt.STORIES[story], seed=seed, log_dir=logdir)
    elif framework == "keras":
        import keras

        from tb_introspect.demo import keras_gpt

        history = keras_gpt.train(gpt.STORIES[story], seed=seed, log_dir=logdir)
        keras.backend.clear_session()
    else:
        lr = gpt.HF_HIGH_LR if story == "gpt_high_lr" else gpt.HF_LOW_LR
        _, history = gpt.train_hf(logdir, lr, seed=seed, introspect={"overhead": None})
        logdir = str(next((Path(logdir) / "runs").iterdir()))
    (run,) = read_logdir(logdir).values()
    p = probes_of(run)
    peak = float("nan")
    if p is not None and p.rows_with("attn_logit_max"):
        import numpy as np

        peak = float(np.nanmax(p.field("attn_logit_max")[list(p.rows_with("attn_logit_max"))]))
    return history, peak, find_issues(run)


def transformer_rows(seeds: list[int], frameworks: list[str]) -> list[str]:
    """The Markdown rows of the transformer validation table."""
    import numpy as np

    from tb_introspect.demo import gpt

    stories = {"torch": list(gpt.STORIES), "keras": list(gpt.STORIES),
               "hf": ["gpt_high_lr", "gpt_low_lr"]}
    labels = {"torch": "PyTorch loop", "keras": "Keras fit", "hf": "HF Trainer (GPT-2)"}
    rows = []
    for fw in frameworks:
        for story in stories[fw]:
            for seed in seeds:
                with tempfile.TemporaryDirectory() as d:
                    t = time.perf_counter()
                    history, peak, found = _transformer_run(fw, story, seed, d)
                    secs = time.perf_counter() - t
                serious = [f for f in found if f.severity in ("warning", "critical")]
                fired = ", ".join(f"`{f.kind}` {f.first_step}" for f in serious
                                  if f.kind in TRANSFORMER_KINDS) or "none"
                live = ", ".join(f"`{k}` {s}" for s, k in history.live
                                 if k in TRANSFORMER_KINDS) or "none"
                other = ", ".join(sorted({f"`{f.kind}`" for f in serious
                                          if f.kind not in TRANSFORMER_KINDS})) or "none"
                direct = float(np.nanmax(history.logit_max))
                note = gpt.STORIES[story].note if fw != "hf" else (
                    "no clipping, AdamW at a high rate" if story == "gpt_high_lr"
                    else "twin: a 30x lower rate")
                rows.append(f"| {labels[fw]}: {story} | {note} | {seed} |"
                            f" {history.diverged or 'never'} | {direct:.3g} / {peak:.3g} |"
                            f" {fired} | {live} | {other} |")
                print(rows[-1], flush=True)  # each row as it comes: the runs take minutes
                print(f"{fw} {story} seed {seed}: {secs:.1f} s", file=sys.stderr)
    return rows


#: ``--defaults``: architecture -> (label, model builder's name in ``demo/gpt.py``, the
#: unstable rate, its twin's, more ``TrainingArguments``). The rates: the lowest tried
#: (0.1, 0.03, 0.01) whose run diverges within 300 steps at seed 0, and 30x lower.
DEFAULTS: dict[str, tuple[str, str, float, float, dict]] = {
    "gpt2": ("GPT-2 (pre-LN)", "gpt2", 1e-1, 3e-3, {}),
    "opt": ("OPT (post-LN)", "opt_post_ln", 3e-2, 1e-3, {}),
    "llama": ("Llama, accumulation 4", "llama", 1e-1, 3e-3,
              {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 4}),
}
#: How much slower (>1) or faster (<1) each step looks to the governor: its clock scaled.
SPEEDS = (1.0, 3.0, 1 / 3)
#: Steps the first transformer warning must come before the divergence.
MARGIN = 20


def _scaled_clock(factor: float):
    """``time.perf_counter`` whose elapsed time is ``factor`` times the real one."""
    t0 = time.perf_counter()
    return lambda: t0 + factor * (time.perf_counter() - t0)


def defaults_run(arch: str, unstable: bool, speed: float, logdir: str, seed: int = 0) -> dict:
    """One ``--defaults`` run: what the table shows of it."""
    from pathlib import Path

    from tb_introspect.demo import gpt
    from tb_introspect.diagnose import find_issues
    from tb_introspect.read import read_logdir
    from tb_introspect.read.series import probes_of

    _, builder, high, low, args = DEFAULTS[arch]
    made = []

    def scale(intro) -> None:
        made.append(intro)
        intro.governor.clock = _scaled_clock(speed)

    with contextlib.redirect_stdout(sys.stderr):  # the Trainer prints each step's logs
        _, history = gpt.train_hf(logdir, high if unstable else low, seed=seed,
                                  introspect={}, model=getattr(gpt, builder), made=scale,
                                  track_logits=False, **args)
    (run,) = read_logdir(str(next((Path(logdir) / "runs").iterdir()))).values()
    p = probes_of(run)
    views = sorted({int(x) for ts in run.tensors.values() for t in ts for x in t.steps})
    found = find_issues(run)
    serious = [f for f in found if f.severity in ("warning", "critical")]
    intro = made[0]
    return {"diverged": history.diverged, "points": len(views),
            "probe_points": 0 if p is None else len(set(p.steps.tolist()) - set(views)),
            "planned": intro.plan.window, "paced": intro.pipeline.window(),
            "fired": [(f.kind, f.first_step) for f in serious if f.kind in TRANSFORMER_KINDS],
            "live": [(k, s) for s, k in history.live if k in TRANSFORMER_KINDS],
            "other": sorted({f.kind for f in serious if f.kind not in TRANSFORMER_KINDS})}


def defaults_rows(archs: list[str], speeds: list[float]) -> tuple[list[str], list[str]]:
    """The Markdown rows of the ``--defaults`` table, and what missed its target."""
    rows, missed = [], []
    for arch in archs:
        label, _, high, low, _ = DEFAULTS[arch]
        for unstable in (True, False):
            for speed in speeds:
                with tempfile.TemporaryDirectory() as d:
                    t = time.perf_counter()
                    r = defaults_run(arch, unstable, speed, d)
                    secs = time.perf_counter() - t
                first = min((s for _, s in r["fired"]), default=None)
                if unstable:
                    lead = (None if first is None or r["diverged"] is None
                            else r["diverged"] - first)
                    ok = lead is not None and lead >= MARGIN
                    verdict = "never" if lead is None else f"{lead} steps"
                else:
                    ok = not r["fired"] and r["diverged"] is None
                    verdict = "-"
                if not ok:
                    missed.append(f"{arch} {'unstable' if unstable else 'twin'} x{speed:.3g}")
                paced = "epoch ends" if r["paced"] is None else str(r["paced"])
                rows.append(
                    f"| {label} | {high if unstable else low:g}"
                    f" ({'unstable' if unstable else 'twin'}) | {_speed(speed)} |"
                    f" {r['diverged'] or 'never'} | {r['points']} + {r['probe_points']} |"
                    f" {r['planned']} / {paced} |"
                    f" {', '.join(f'`{k}` {s}' for k, s in r['fired']) or 'none'} |"
                    f" {', '.join(f'`{k}` {s}' for k, s in r['live']) or 'none'} |"
                    f" {verdict} | {', '.join(f'`{k}`' for k in r['other']) or 'none'} |")
                print(rows[-1], flush=True)
                print(f"{arch} {'unstable' if unstable else 'twin'} x{speed:.3g}:"
                      f" {secs:.1f} s", file=sys.stderr, flush=True)
    return rows, missed


def _speed(factor: float) -> str:
    if factor == 1:
        return "as measured"
    return f"{factor:g}x slower" if factor > 1 else f"{1 / factor:.3g}x faster"


def _end(end: dict) -> str:
    """Where a healthy run ended: its training accuracy and loss (against the chain's entropy
    for a language model)."""
    parts = []
    if "accuracy" in end:
        parts.append(f"acc {100 * end['accuracy']:.0f}%")
    if "loss" in end:
        parts.append(f"loss {end['loss']:.3g}" + (f" (floor {end['floor']:.2f})"
                                                   if "floor" in end else ""))
    if "val_accuracy" in end:
        parts.append(f"val acc {100 * end['val_accuracy']:.0f}%")
    return ", ".join(parts) or "-"


def healthy_rows(names: list[str] | None) -> tuple[list[str], int, int]:
    """The Markdown rows of the healthy corpus's table; the runs and the warnings."""
    from tests.diagnose.findings_healthy import CORPUS, SERIOUS, train_all

    labels = {"keras": "Keras fit", "torch": "PyTorch loop", "hf": "HF Trainer",
              "lightning": "Lightning"}
    rows: list[str] = []
    n_warn = 0

    def report(o) -> None:
        nonlocal n_warn
        h = CORPUS[o.name]
        warned = o.warnings()
        n_warn += len(warned)
        shown = "; ".join(f"{kind} ({'end' if p < 0 else f'point {p}'})"
                          for p, kind, _ in warned) or "none"
        infos = ", ".join(sorted({f.kind for f in o.final if f.severity not in SERIOUS
                                  and f.kind != "insufficient_data"})) or "none"
        rows.append(f"| {o.name} | {labels[h.framework]} | {h.note} | {_end(o.end)} |"
                    f" {shown} | {infos} |")
        print(rows[-1], flush=True)
        for p, kind, title in warned:
            print(f"    {kind} at {p}: {title}", file=sys.stderr)
        print(f"{o.name}: {o.seconds:.1f} s", file=sys.stderr, flush=True)

    outs = train_all(names, report)
    return rows, len(outs), n_warn


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", nargs="*", default=None, help="scenario names")
    p.add_argument("--epochs", type=int, default=None, help="override each scenario's epochs")
    p.add_argument("--pairs-only", action="store_true", help="the findings_pairs runs only")
    p.add_argument("--archs-only", action="store_true", help="the findings_archs runs only")
    p.add_argument("--transformers", action="store_true",
                   help="the small GPTs' table only (tb_introspect/demo/gpt.py)")
    p.add_argument("--seeds", nargs="*", type=int, default=[0, 1, 2, 3])
    p.add_argument("--frameworks", nargs="*", default=["torch", "keras", "hf"],
                   choices=["torch", "keras", "hf"])
    p.add_argument("--threads", type=int, default=1, help="compute threads per framework")
    p.add_argument("--healthy", action="store_true",
                   help="the healthy corpus only (tests/diagnose/findings_healthy.py)")
    p.add_argument("--defaults", action="store_true",
                   help="HF Trainer runs at the callback's defaults (paced), three"
                        " architectures at three apparent speeds")
    p.add_argument("--speeds", nargs="*", type=float, default=list(SPEEDS),
                   help="--defaults: the governor's clock scales (3: steps look 3x slower)")
    args = p.parse_args(argv)
    if args.defaults:
        import torch

        os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
        torch.set_num_threads(args.threads)
        t0 = time.perf_counter()
        print("| model | peak rate | step as the governor sees it | loss diverged at step |"
              " points + probe points | window planned / paced | transformer findings"
              " (first step) | seen live (at step) | first warning before the divergence |"
              " other warnings |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        archs = [a for a in (args.only or DEFAULTS) if a in DEFAULTS]
        rows, missed = defaults_rows(archs, args.speeds)
        print(f"\n{len(rows)} runs, {time.perf_counter() - t0:.0f} s wall;"
              f" {'every run met its target' if not missed else 'missed: ' + ', '.join(missed)}",
              file=sys.stderr)
        return
    if args.healthy:
        import torch

        os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
        os.environ.setdefault("TF_NUM_INTRAOP_THREADS", str(args.threads))
        torch.set_num_threads(args.threads)
        t0 = time.perf_counter()
        print("| run | trained by | what | where it ended | warnings live (first point) |"
              " info at the end |")
        print("|---|---|---|---|---|---|")
        _, n_runs, n_warn = healthy_rows(args.only)
        print(f"\n{n_runs} healthy runs, {n_warn} warnings"
              f" ({time.perf_counter() - t0:.0f} s wall)", flush=True)
        return
    if args.transformers:
        import torch

        torch.set_num_threads(args.threads)
        if "keras" in args.frameworks:
            import tensorflow as tf

            tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        t0 = time.perf_counter()
        print("| run | what | seed | loss diverged at step | attention logit max (every step"
              " / probes) | transformer findings (first step) | seen live (at step) |"
              " other warnings |")
        print("|---|---|---|---|---|---|---|---|")
        rows = transformer_rows(args.seeds, args.frameworks)
        print(f"\n{len(rows)} runs, {time.perf_counter() - t0:.0f} s wall", file=sys.stderr)
        return
    from tests.diagnose.findings_archs import SCENARIOS, train_scenario
    from tests.diagnose.findings_pairs import PAIRS, train_pair

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
