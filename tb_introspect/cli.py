"""The ``tb-introspect`` command: ``demo`` (train the demo, optionally serve it) and ``diagnose``.

Only ``demo`` imports TensorFlow, and only once it starts training: ``--help`` and
``diagnose`` run on a machine (or in an environment) without TensorFlow. ``diagnose`` reads
runs with ``tb_introspect.read`` and prints what the findings engine (``tb_introspect.diagnose``)
finds, the same findings the Overview tab shows (docs/design.md).

Exit codes: 0 success; 1 a run-time failure (training or TensorBoard failed, no tb-introspect
data found); 2 bad usage (unknown option, missing log directory, port in use); 130 interrupted.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import socket
import subprocess
import sys
import time
import types
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import TextIO

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


def _int_in(text: str, low: int, high: int | None, expected: str) -> int:
    """``text`` as an integer in ``[low, high]``, else an argparse error naming ``expected``."""
    try:
        value = int(text)
    except ValueError:
        value = low - 1
    if value < low or (high is not None and value > high):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return value


def _every(text: str) -> str | int:
    return text if text == "epoch" else _int_in(text, 1, None, "'epoch' or a positive integer")


def _positive_int(text: str) -> int:
    return _int_in(text, 1, None, "a positive integer")


def _port(text: str) -> int:
    return _int_in(text, 1, 65535, "a port number 1-65535")


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
    demo.add_argument("--framework", choices=("keras", "torch", "jax"), default="keras",
                      help="train with Keras (default), PyTorch or JAX and Flax (each needs"
                      " its framework installed)")
    demo.add_argument("--flax", choices=("linen", "nnx"), default="linen",
                      help="with --framework jax: the models in Flax Linen (default) or NNX")
    demo.add_argument("--no-progress", action="store_true", help="do not draw progress bars")
    demo.set_defaults(func=cmd_demo)

    diag = sub.add_parser(
        "diagnose",
        help="print the findings for every run of a logdir",
        description="Read the tb-introspect data of every run under LOGDIR and print, per run,"
        " the findings of the rules (vanishing gradients, dead units, loss not decreasing,"
        " ...), most severe first: the findings of the Overview tab. Does not need"
        " TensorFlow.",
    )
    diag.add_argument("logdir", metavar="LOGDIR", help="TensorBoard log directory")
    diag.add_argument("--json", action="store_true", help="print JSON instead of text")
    diag.add_argument("-v", "--verbose", action="store_true",
                      help="with each finding, its evidence, explanation and what to try")
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
            framework=args.framework, flax=args.flax,
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
    """Print the findings of every run of ``args.logdir`` (text or ``--json``)."""
    logdir = args.logdir
    if not os.path.exists(logdir):
        raise CliError(f"log directory {logdir!r} does not exist")
    if not os.path.isdir(logdir):
        raise CliError(f"{logdir!r} is not a directory")
    _read_without_tensorflow()
    from tb_introspect import diagnose
    from tb_introspect.read import read_logdir

    runs = read_logdir(logdir, runs=args.run)
    if not runs:
        what = f"runs {', '.join(args.run)}" if args.run else "runs"
        raise CliError(
            f"no tb-introspect {what} found under {logdir!r} (looked for TensorBoard event"
            " files holding Introspect summaries; train with tb_introspect.keras.Introspect"
            " or run `tb-introspect demo` first)", EXIT_FAILURE,
        )
    by_run = {name: diagnose.find_issues(run) for name, run in runs.items()}
    if args.json:
        doc = {"logdir": logdir,
               "runs": [{"run": name, "findings": diagnose.findings_json(found)}
                        for name, found in by_run.items()]}
        json.dump(doc, sys.stdout, indent=2, allow_nan=False)
        print()
    else:
        print(f"tb-introspect diagnose {logdir}: {len(by_run)} run(s)\n")
        sys.stdout.write(diagnose.format_findings(by_run, verbose=args.verbose))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
