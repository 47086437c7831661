"""The ``tb-introspect`` command: ``demo`` (train the demo, optionally serve it) and ``diagnose``.

Only ``demo`` imports TensorFlow, and only once it starts training: ``--help`` and
``diagnose`` run on a machine (or in an environment) without TensorFlow.

Exit codes: 0 success; 1 a run-time failure (training or TensorBoard failed, no tb-introspect
data found); 2 bad usage (unknown option, missing log directory, port in use); 130 interrupted.
"""

from __future__ import annotations

import argparse
import errno
import json
import math
import os
import socket
import subprocess
import sys
import time
import types
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any, TextIO

from tb_introspect import __version__

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

DEFAULT_LOGDIR = os.path.join("logs", "demo")
DEFAULT_PORT = 6006
DEFAULT_HOST = "localhost"
#: How long ``demo --serve`` waits for TensorBoard to answer (it imports a lot on start).
SERVE_START_TIMEOUT_S = 180.0


class CliError(Exception):
    """A failure to report as one line on stderr, with an exit code."""

    def __init__(self, message: str, code: int = EXIT_USAGE):
        super().__init__(message)
        self.code = code


# --------------------------------------------------------------------------- arguments


def _every(text: str) -> str | int:
    if text == "epoch":
        return text
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected 'epoch' or a positive integer, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number 1-65535, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``tb-introspect`` and its subcommands."""
    # Cheap: the scenario list does not import Keras.
    from tb_introspect.demo.models import EPOCHS, SCENARIOS

    parser = argparse.ArgumentParser(
        prog="tb-introspect",
        description="See inside a neural network while it trains: per-layer statistics of"
        " weights, gradients, layer outputs and output gradients in TensorBoard.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    scenario_lines = "\n".join(f"  {i}_{s.name}: {s.title}" for i, s in enumerate(SCENARIOS, 1))
    demo = sub.add_parser(
        "demo",
        help="train the demo models into a logdir (and serve it with --serve)",
        description="Train four small models on scikit-learn's handwritten digits (shipped"
        " with scikit-learn, no download), one TensorBoard run each:\n\n" + scenario_lines
        + "\n\nRuns are added beside existing ones (with a _2, _3... suffix when the names"
        " are taken); nothing is overwritten. Needs TensorFlow and scikit-learn.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    demo.add_argument("--logdir", default=DEFAULT_LOGDIR,
                      help=f"TensorBoard log directory (default: {DEFAULT_LOGDIR})")
    demo.add_argument("--serve", action="store_true",
                      help="after training, start TensorBoard on the logdir and print its URL")
    demo.add_argument("--port", type=_port, default=DEFAULT_PORT,
                      help=f"port for --serve (default: {DEFAULT_PORT})")
    demo.add_argument("--host", default=DEFAULT_HOST,
                      help=f"address TensorBoard binds to with --serve (default: {DEFAULT_HOST};"
                      " 0.0.0.0 for all interfaces)")
    demo.add_argument("--epochs", type=_positive_int, default=None,
                      help=f"epochs per run (default: {EPOCHS}; fewer with --quick)")
    demo.add_argument("--quick", action="store_true",
                      help="fast variant for tests: "
                      + ", ".join(f"{s.quick_epochs} epochs of {s.name}" for s in SCENARIOS)
                      + "; each still shows its situation")
    demo.add_argument("--scenario", action="append", choices=[s.name for s in SCENARIOS],
                      metavar="NAME", help="run only this scenario (repeatable): "
                      + ", ".join(s.name for s in SCENARIOS))
    demo.add_argument("--every", type=_every, default="epoch",
                      help="statistics cadence: 'epoch' (aggregated per epoch, default) or N"
                      " (every N steps)")
    demo.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    demo.add_argument("--no-progress", action="store_true", help="do not draw progress bars")
    demo.set_defaults(func=cmd_demo)

    diag = sub.add_parser(
        "diagnose",
        help="print findings (or a summary) for every run of a logdir",
        description="Read the tb-introspect data of every run under LOGDIR and print, per run,"
        " the findings of the rules (vanishing gradients, dead units, ...) when they are"
        " installed, and a summary: layers, final RMS per view, first/last layer gradient"
        " ratio, worst dead rate, loss trend. Does not need TensorFlow.",
    )
    diag.add_argument("logdir", metavar="LOGDIR", help="TensorBoard log directory")
    diag.add_argument("--json", action="store_true", help="print JSON instead of text")
    diag.add_argument("--run", action="append", metavar="RUN",
                      help="only this run (relative path under LOGDIR; repeatable)")
    diag.set_defaults(func=cmd_diagnose)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tb-introspect`` console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return int(args.func(args))
    except CliError as e:
        print(f"tb-introspect {args.command}: error: {e}", file=sys.stderr)
        return e.code
    except KeyboardInterrupt:
        print(f"tb-introspect {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


# --------------------------------------------------------------------------- demo


def cmd_demo(args: argparse.Namespace) -> int:
    """Train the demo scenarios; with ``--serve`` start TensorBoard on the logdir."""
    logdir = args.logdir
    if os.path.exists(logdir) and not os.path.isdir(logdir):
        raise CliError(f"--logdir {logdir!r} exists and is not a directory")
    if args.serve:
        # Check before training, not after minutes of it.
        ensure_port_free(args.host, args.port)

    from tb_introspect.demo.run import run_demo  # imports TensorFlow when it trains

    start = time.perf_counter()
    try:
        results = run_demo(
            logdir, epochs=args.epochs, quick=args.quick, scenarios=args.scenario,
            every=args.every, seed=args.seed, progress=not args.no_progress,
        )
    except OSError as e:
        raise CliError(f"cannot write to --logdir {logdir!r}: {e}") from e
    total = time.perf_counter() - start

    print(f"\nTrained {len(results)} runs in {total:.0f} s into {os.path.abspath(logdir)}:")
    for r in results:
        print(f"  {r.run_name:<28} {r.epochs:>3} epochs {r.seconds:6.1f} s   "
              f"loss {r.final('loss'):.3f}  val_accuracy {r.final('val_accuracy'):.3f}")
        print(f"  {'':<28} look for: {r.scenario.look_for}")
    if not args.serve:
        print(f"\nView them:  tensorboard --logdir {logdir}   (Introspect tab)")
        print(f"Findings:   tb-introspect diagnose {logdir}")
        return EXIT_OK
    return serve(logdir, args.host, args.port)


def ensure_port_free(host: str, port: int) -> None:
    """Raise :class:`CliError` when ``host:port`` is taken or ``host`` is not usable."""
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise CliError(f"--host {host!r} cannot be resolved: {e}") from e
    for family, kind, proto, _name, address in infos:
        with socket.socket(family, kind, proto) as s:
            # SO_REUSEADDR like TensorBoard's server: only a live listener counts as "in use".
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(address)
            except OSError as e:
                if e.errno == errno.EADDRINUSE:
                    raise CliError(
                        f"port {port} is already in use on {host}; pick another with"
                        f" --port (for example --port {port + 1}) or stop the program using it"
                    ) from e
                if e.errno == errno.EADDRNOTAVAIL and len(infos) > 1:
                    continue  # e.g. no IPv6 on this machine; the other address decides
                raise CliError(f"cannot listen on {host}:{port}: {e.strerror or e}") from e


def display_url(host: str, port: int) -> str:
    """The URL to print for a TensorBoard bound to ``host:port``, opening the Introspect tab."""
    if host in ("", "0.0.0.0", "::"):
        host = socket.gethostname()
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    return f"http://{host}:{port}/#introspect"


def serve(logdir: str, host: str, port: int, out: TextIO | None = None) -> int:
    """Run TensorBoard on ``logdir`` until it exits or Ctrl+C; return the exit code."""
    out = out if out is not None else sys.stdout
    ensure_port_free(host, port)  # may have been taken while training
    cmd = [sys.executable, "-m", "tensorboard.main", "--logdir", logdir,
           "--port", str(port), "--host", host]
    print(f"\nStarting TensorBoard: {' '.join(cmd[2:])}", file=out, flush=True)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        listing = _wait_for_tensorboard(proc, host, port)
        if listing is None:
            output = proc.stdout.read() if proc.stdout else ""
            tail = "\n".join(output.strip().splitlines()[-15:])
            if "could not bind" in output.lower() or "address already in use" in output.lower():
                raise CliError(f"TensorBoard could not use port {port}; pick another with"
                               f" --port\n{tail}")
            raise CliError(f"TensorBoard did not start (exit code {proc.returncode}):\n{tail}",
                           EXIT_FAILURE)
        if "introspect" not in listing:
            print("warning: TensorBoard does not list the Introspect plugin; is tb-introspect"
                  " installed in the same environment as TensorBoard?", file=sys.stderr)
        print(f"TensorBoard is serving the demo at {display_url(host, port)}"
              "   (Ctrl+C to stop)", file=out, flush=True)
        _drain(proc)
        return EXIT_OK if proc.wait() == 0 else EXIT_FAILURE
    except KeyboardInterrupt:
        print("\nStopping TensorBoard.", file=out, flush=True)
        return EXIT_OK
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _wait_for_tensorboard(proc: subprocess.Popen, host: str, port: int) -> dict | None:
    """Poll TensorBoard's plugin listing until it answers; ``None`` if the process died."""
    probe_host = "127.0.0.1" if host in ("", "0.0.0.0") else ("::1" if host == "::" else host)
    if ":" in probe_host:
        probe_host = f"[{probe_host}]"
    url = f"http://{probe_host}:{port}/data/plugins_listing"
    deadline = time.monotonic() + SERVE_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return None
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                return json.load(r)
        except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError):
            time.sleep(0.5)
    proc.terminate()
    proc.wait()
    return None


def _drain(proc: subprocess.Popen) -> None:
    """Forward TensorBoard's own output until it exits (its pipe must not fill up)."""
    if proc.stdout is None:
        return
    for line in proc.stdout:
        sys.stderr.write(line)


# --------------------------------------------------------------------------- diagnose


def _read_without_tensorflow() -> None:
    """Make TensorBoard's event reader use its TF-free stub even when TensorFlow is installed.

    ``tensorboard.compat`` imports TensorFlow (seconds, gigabytes) unless the module
    ``tensorboard.compat.notf`` exists: that is TensorBoard's own switch for this.
    """
    name = "tensorboard.compat.notf"
    sys.modules.setdefault(name, types.ModuleType(name))


def cmd_diagnose(args: argparse.Namespace) -> int:
    """Print findings and a summary per run of ``args.logdir``."""
    logdir = args.logdir
    if not os.path.exists(logdir):
        raise CliError(f"log directory {logdir!r} does not exist")
    if not os.path.isdir(logdir):
        raise CliError(f"{logdir!r} is not a directory")
    _read_without_tensorflow()
    from tb_introspect.plugin.overview import find_issues_hook
    from tb_introspect.plugin.reader import read_logdir

    runs = read_logdir(logdir, runs=args.run)
    if not runs:
        what = f"runs {', '.join(args.run)}" if args.run else "runs"
        raise CliError(
            f"no tb-introspect {what} found under {logdir!r} (looked for TensorBoard event"
            " files holding Introspect summaries; train with tb_introspect.keras.Introspect"
            " or run `tb-introspect demo` first)", EXIT_FAILURE,
        )
    report = []
    for name, run in runs.items():
        findings, error = find_issues_hook(run)
        entry: dict[str, Any] = {"run": name, "summary": summarize_run(run),
                                 "findings": findings}
        if error is not None:
            entry["findings_error"] = error
        report.append(entry)
    if args.json:
        json.dump({"logdir": logdir, "runs": report}, sys.stdout, indent=2,
                  default=_json_default, allow_nan=False)
        print()
    else:
        print_report(logdir, report, sys.stdout)
    return EXIT_OK


def _json_default(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


def _finite(x: float) -> float | None:
    return float(x) if x is not None and math.isfinite(x) else None


def summarize_run(run: Any) -> dict[str, Any]:
    """Per-run numbers the overview shows, from a :class:`~tb_introspect.plugin.reader.RunSeries`.

    All values are plain Python (JSON-ready; ``None`` where there is no data).
    """
    import numpy as np

    layers: dict[str, int] = {}
    last_step = -1
    for view in run.tensors.values():
        for s in view:
            layers.setdefault(s.info.layer, s.info.depth)
            if len(s):
                last_step = max(last_step, int(s.steps[-1]))
    epochs = [float(s.epochs[-1]) for v in run.tensors.values() for s in v if len(s)]
    epochs += [float(s.epochs[-1]) for s in run.metrics.values() if len(s)]
    finite_epochs = [e for e in epochs if math.isfinite(e)]

    views: dict[str, Any] = {}
    nonfinite = 0
    for view, series in run.tensors.items():
        finals = [s.field("rms")[-1] for s in series if len(s)]
        finals = [x for x in finals if math.isfinite(x)]
        nonfinite += sum(
            int(np.nansum(s.field(f))) for s in series
            for f in ("nan_count", "posinf_count", "neginf_count")
        )
        views[view] = {
            "tensors": len(series),
            "final_rms_min": _finite(min(finals)) if finals else None,
            "final_rms_median": _finite(float(np.median(finals))) if finals else None,
            "final_rms_max": _finite(max(finals)) if finals else None,
        }
    return {
        "layers": len(layers),
        "last_step": last_step if last_step >= 0 else None,
        "epochs": int(max(finite_epochs)) + 1 if finite_epochs else None,
        "views": views,
        "gradient_first_last": _gradient_first_last(run),
        "dead": _worst_dead(run),
        "loss": _loss_trend(run),
        "nonfinite_values": nonfinite,
    }


def _layer_rms(series: Sequence[Any]) -> dict[str, tuple[int, float]]:
    """Final RMS per layer over all of the layer's tensors: sqrt(Σ l2² / Σ count)."""
    sums: dict[str, list[float]] = {}
    for s in series:
        if not len(s):
            continue
        l2, count = s.field("l2")[-1], s.field("count")[-1]
        if not (math.isfinite(l2) and math.isfinite(count)) or count <= 0:
            continue
        acc = sums.setdefault(s.info.layer, [s.info.depth, 0.0, 0.0])
        acc[1] += l2 * l2
        acc[2] += count
    return {layer: (int(d), math.sqrt(sq / n)) for layer, (d, sq, n) in sums.items() if n > 0}


def _gradient_first_last(run: Any) -> dict[str, Any] | None:
    per_layer = _layer_rms(run.tensors.get("gradient", []))
    if len(per_layer) < 2:
        return None
    ordered = sorted(per_layer.items(), key=lambda kv: kv[1][0])
    (first, (_, rms_first)), (last, (_, rms_last)) = ordered[0], ordered[-1]
    return {
        "first_layer": first, "last_layer": last,
        "first_rms": _finite(rms_first), "last_rms": _finite(rms_last),
        "ratio": _finite(rms_first / rms_last) if rms_last > 0 else None,
    }


def _worst_dead(run: Any) -> dict[str, Any] | None:
    """The hidden layer with the highest final dead rate of its outputs.

    Only layers with trainable variables count, and not the deepest one: a pooling or
    flatten layer repeats its input's dead channels, and a softmax output that is exactly 0
    for most classes is a confident prediction, not a dead unit.
    """
    import numpy as np

    depth = {s.info.layer: s.info.depth
             for v in ("variable", "gradient") for s in run.tensors.get(v, [])}
    hidden = set(depth) - {max(depth, key=lambda k: depth[k])} if depth else None
    best: dict[str, Any] | None = None
    for s in run.tensors.get("output", []):
        if hidden is not None and s.info.layer not in hidden:
            continue
        dead = s.field("dead_rate")
        if not len(s) or not np.isfinite(dead).any():
            continue
        final = float(dead[-1]) if math.isfinite(dead[-1]) else float("nan")
        peak = float(np.nanmax(dead))
        if best is None or (math.isfinite(final) and final > (best["final"] or -1.0)):
            best = {"layer": s.info.layer, "final": _finite(final), "peak": _finite(peak),
                    "first": _finite(float(dead[0]))}
    return best


def _loss_trend(run: Any) -> dict[str, Any] | None:
    """Per-epoch median loss: first, best, last, and a one-word trend."""
    import numpy as np

    band = run.metric_epochs.get("loss")
    if band is not None and len(band):
        medians, epochs = band.field("p50"), band.epochs
    else:
        step = run.metrics.get("loss")
        if step is None or not len(step):
            return None
        values, epochs_all = step.field("value"), step.epochs
        epochs = np.unique(epochs_all[np.isfinite(epochs_all)])
        medians = np.array([np.nanmedian(values[epochs_all == e]) for e in epochs])
    keep = np.isfinite(medians)
    medians, epochs = medians[keep], epochs[keep]
    if not len(medians):
        return None
    first, last = float(medians[0]), float(medians[-1])
    i_best = int(np.argmin(medians))
    best = float(medians[i_best])
    if len(medians) < 3:
        trend = "too short to tell"
    elif last > 2.0 * best + 0.02 and i_best < len(medians) - 1:
        trend = f"worse since epoch {int(epochs[i_best])}"
    elif last < 0.7 * first:
        trend = "falling"
    elif last > 1.1 * first:
        trend = "rising"
    else:
        trend = "flat"
    return {"first": first, "best": best, "best_epoch": int(epochs[i_best]), "last": last,
            "trend": trend}


def _fmt(x: float | None, spec: str = ".2e") -> str:
    return "n/a" if x is None else format(x, spec)


def print_report(logdir: str, report: Sequence[dict[str, Any]], out: TextIO) -> None:
    """The text form of ``diagnose``."""
    print(f"tb-introspect diagnose {logdir}: {len(report)} run(s)", file=out)
    for entry in report:
        s = entry["summary"]
        print(f"\n== {entry['run']}  ({s['layers']} layers, {s['epochs'] or '?'} epochs,"
              f" last step {s['last_step'] if s['last_step'] is not None else '?'})", file=out)
        findings = entry.get("findings") or []
        if entry.get("findings_error"):
            print(f"  findings: {entry['findings_error']}", file=out)
        elif findings:
            print(f"  findings ({len(findings)}):", file=out)
            for f in findings:
                print(_format_finding(f), file=out)
        loss = s["loss"]
        if loss:
            print(f"  loss (epoch median): first {loss['first']:.3f}, best {loss['best']:.3f}"
                  f" at epoch {loss['best_epoch']}, last {loss['last']:.3f} -> {loss['trend']}",
                  file=out)
        for view, v in s["views"].items():
            print(f"  {view:<16} {v['tensors']:>3} tensors, final RMS {_fmt(v['final_rms_min'])}"
                  f" .. {_fmt(v['final_rms_max'])} (median {_fmt(v['final_rms_median'])})",
                  file=out)
        g = s["gradient_first_last"]
        if g:
            ratio = _fmt(g["ratio"])
            if g["ratio"] is None and g["first_rms"] == 0 and g["last_rms"] == 0:
                ratio = "n/a, all zero: no gradient reaches the weights"
            print(f"  gradient RMS first/last layer: {ratio}"
                  f" ({g['first_layer']} {_fmt(g['first_rms'])} / {g['last_layer']}"
                  f" {_fmt(g['last_rms'])})", file=out)
        d = s["dead"]
        if d:
            print(f"  worst dead rate (hidden layers): {d['layer']} {_pct(d['final'])} at the end"
                  f" (start {_pct(d['first'])}, peak {_pct(d['peak'])})", file=out)
        if s["nonfinite_values"]:
            print(f"  non-finite values (NaN/Inf) logged: {s['nonfinite_values']}", file=out)


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.0f}%"


def _format_finding(f: Any) -> str:
    """One finding (a dict from the rules) as indented text; tolerant of missing keys."""
    if not isinstance(f, dict):
        return f"    - {f}"
    severity = str(f.get("severity", "info")).upper()
    title = f.get("title") or f.get("summary") or f.get("message") or f.get("kind", "finding")
    where = []
    for key, label in (("first_epoch", "epoch"), ("first_step", "step")):
        if f.get(key) is not None:
            where.append(f"{label} {f[key]}")
    layers = f.get("layers")
    if layers:
        shown = ", ".join(map(str, layers[:4])) + (" ..." if len(layers) > 4 else "")
        where.append(f"layers {shown}")
    lines = [f"    [{severity}] {title}" + (f"  ({'; '.join(where)})" if where else "")]
    for key, label in (("explanation", ""), ("what_to_try", "try: "), ("suggestion", "try: ")):
        if f.get(key):
            lines.append(f"        {label}{f[key]}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
