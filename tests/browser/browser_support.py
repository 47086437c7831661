"""Shared helpers of the browser tests and the frontend benchmark.

A small, fully known logdir written with the real numpy writer path
(``tb_introspect.summary_pb`` + ``tb_introspect.writer.NumpyWriter``), a real
``tensorboard`` process on a free port, and Debian's headless Chromium driven
by Playwright. Nothing is mocked: the tests see exactly what a user sees.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tensorboard.compat.proto import summary_pb2

from tb_introspect import slots, summary_pb
from tb_introspect.writer import NumpyWriter
from tests.plugin.plugin_testlib import NO_TF_TENSORBOARD, served_port

REPO = Path(__file__).resolve().parents[2]
SCREENSHOTS = REPO / "artifacts" / "screenshots"
#: Debian's headless shell (package chromium-headless-shell): the same Blink as the full
#: browser without its UI process, which Playwright also drives by default for headless
#: pages; the browser tests' Chromium cost a quarter fewer CPU-seconds with it. The full
#: ``chromium`` serves where the shell is not installed.
CHROMIUM = (os.environ.get("TB_INTROSPECT_CHROMIUM") or shutil.which("chromium-headless-shell")
            or shutil.which("chromium"))
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

# Normal quantiles at 0, 12.5, ..., 100 % (the extremes clipped at +-3 sigma),
# and half-normal quantiles (|x| of a normal) at the same points.
NORMAL_Z = (-3.0, -1.1503, -0.6745, -0.3186, 0.0, 0.3186, 0.6745, 1.1503, 3.0)
HALF_NORMAL_Z = (0.001, 0.1573, 0.3186, 0.4888, 0.6745, 0.8871, 1.1503, 1.5341, 3.0)

STEPS_PER_EPOCH = 30
EPOCHS = 4
#: The (view, tensor name, layer, depth, shape) monitored in the fixture runs.
#: One layer name holds HTML special characters: it must render as text.
HTML_LAYER = 'dense<b>&"x"</b>'
TENSORS = {
    "variable": [
        ("conv1/kernel", "conv1", 0, (3, 3, 3, 8)),
        ("conv1/bias", "conv1", 0, (8,)),
        ("conv2/kernel", "conv2", 1, (3, 3, 8, 16)),
        ("conv2/bias", "conv2", 1, (16,)),
        (HTML_LAYER + "/kernel", HTML_LAYER, 2, (256, 10)),
        (HTML_LAYER + "/bias", HTML_LAYER, 2, (10,)),
    ],
    "output": [
        ("conv1", "conv1", 0, (-1, 16, 16, 8)),
        ("conv2", "conv2", 1, (-1, 8, 8, 16)),
        (HTML_LAYER, HTML_LAYER, 2, (-1, 10)),
    ],
}
TENSORS["gradient"] = TENSORS["variable"]
TENSORS["output_gradient"] = TENSORS["output"]


def known_rms(run: str, view: str, index: int, step: int) -> float:
    """The RMS the fixture logs: a smooth, distinct curve per (run, view, tensor)."""
    base = {"variable": 0.05, "gradient": 1e-3, "output": 0.5, "output_gradient": 1e-4}[view]
    lr = 0.1 if run.endswith("lr_0.1") else 0.01
    # Earlier tensors carry larger gradients (no vanishing gradients), decaying with training.
    scale = base * (1.0 + 0.7 * (5 - index)) * (1.0 + 10 * lr * math.exp(-step / 40.0))
    return scale * (1.0 + 0.05 * math.sin(step / 3.0 + index))


def known_dead_rate(index: int, step: int) -> float:
    """Dead-channel rate of output tensor ``index``: the two last layers slowly die."""
    if index == 2:
        return min(0.62, step / 150.0)
    if index == 1:  # conv2: over half its channels dead from step 100 (a finding)
        return min(0.55, step / 200.0)
    return 0.0


def known_lr(run: str) -> float:
    """The learning rate of a fixture run (its name says it)."""
    return 0.1 if run.endswith("lr_0.1") else 0.01


def known_loss(run: str, step: int) -> float:
    lr = 0.1 if run.endswith("lr_0.1") else 0.01
    return 0.1 + 2.2 * math.exp(-step * lr * 0.4) * (1.0 + 0.1 * math.sin(step * 1.7))


def nan_steps(run: str, view: str, index: int) -> range:
    """Steps at which the fixture logs NaN statistics (gaps + counts in the readout)."""
    if run.endswith("lr_0.1") and view == "gradient" and index == 4:
        return range(100, 104)
    return range(0)


def stats_vector(run: str, view: str, index: int, step: int, shape) -> list[float]:
    fields = slots.tensor_stats_fields(view)
    rms = known_rms(run, view, index, step)
    size = 1
    for d in shape:
        size *= 32 if d < 0 else d
    dead = known_dead_rate(index, step) if view == "output" else 0.0
    relu = view == "output"
    values = {
        "epoch": (step - 1) // STEPS_PER_EPOCH,
        "count": size,
        "finite_count": size,
        "nan_count": 0,
        "posinf_count": 0,
        "neginf_count": 0,
        "zero_fraction": 0.5 * (1 - dead) + dead if relu else 0.0,
        "sign_balance": 0.5 + 0.5 * dead if relu else 0.1 * math.sin(step / 7 + index),
        "mean": 0.0,
        "std": rms,
        "rms": rms,
        "l2": rms * math.sqrt(size),
        # Layer outputs are rectified (ReLU): never negative, with exact zeros.
        "min": 0.0 if relu else -3 * rms,
        "max": 3 * rms,
        "activation_rate": (1 - dead) * 0.5 if relu else 1.0,
        "dead_rate": dead,
        # Only convolutional outputs have spatial positions.
        "spatial_dead_rate": 0.01 * index if relu and len(shape) == 4 else float("nan"),
        "update_ratio": 1e-3,
        "cos_prev": 0.5,
        # The window's step counts: unknown, as from a writer that does not record them.
        "stats_steps": float("nan"),
        "activity_steps": float("nan"),
        "steps": float("nan"),
    }
    for q, z, hz in zip(slots.DEFAULT_QUANTILES, NORMAL_Z, HALF_NORMAL_Z, strict=True):
        values[slots.quantile_field(q)] = max(z, 0.0) * rms if relu else z * rms
        values[slots.quantile_field(q, log=True)] = math.log10(hz * rms)
        # Implicit learning rate: the run's rate at the median, a decade from min to max.
        values[slots.ILR_PREFIX + slots.quantile_field(q)] = \
            known_lr(run) * 10.0 ** ((q - 50.0) / 100.0)
    if step in nan_steps(run, view, index):
        for key in values:
            if key not in ("epoch", "count"):
                values[key] = float("nan")
        values["nan_count"] = 5
        values["finite_count"] = size - 5
    return [float(values[f]) for f in fields]


def write_run(logdir: Path, run: str, views=slots.VIEWS, steps: int = 120,
              first_step: int = 1) -> None:
    """Write one fixture run: per-step stats of ``views``, loss/accuracy and epoch bands."""
    writer = NumpyWriter(logdir / run)
    losses: list[float] = [known_loss(run, s) for s in range(1, first_step)]
    for step in range(first_step, steps + 1):
        epoch = (step - 1) // STEPS_PER_EPOCH
        summary = summary_pb2.Summary()
        for view in views:
            for index, (name, layer, depth, shape) in enumerate(TENSORS[view]):
                s = summary_pb.tensor_stats_pb(
                    stats_vector(run, view, index, step, shape),
                    view=view, name=name, layer=layer, depth=depth, shape=shape,
                )
                summary.value.extend(s.value)
        loss = known_loss(run, step)
        losses.append(loss)
        summary.value.extend(summary_pb.metric_pb("loss", loss, epoch).value)
        acc = 1.0 - loss / 2.5
        summary.value.extend(summary_pb.metric_pb("accuracy", acc, epoch).value)
        if step % STEPS_PER_EPOCH == 0:
            band = summary_pb.metric_epoch_pb("loss", losses[-STEPS_PER_EPOCH:], epoch)
            summary.value.extend(band.value)
        writer.add_summary(summary, step, wall_time=1.7e9 + step)
    writer.close()


def write_fixture_logdir(logdir: Path) -> Path:
    """Two comparable runs in a nested folder, and one run with only gradients."""
    write_run(logdir, "exp1/lr_0.01")
    write_run(logdir, "exp1/lr_0.1")
    write_run(logdir, "gradients_only", views=("gradient",), steps=60)
    return logdir


@dataclass
class TensorBoard:
    url: str  # the TensorBoard page, with the path prefix and a trailing slash
    process: subprocess.Popen
    log_path: Path

    def plugin_url(self, route: str) -> str:
        return self.url + "data/plugin/introspect/" + route

    def get_json(self, route: str):
        with urllib.request.urlopen(self.plugin_url(route), timeout=30) as r:
            return json.loads(r.read())


@contextlib.contextmanager
def tensorboard(logdir: Path | str, path_prefix: str = "", wait_runs: int = 1,
                extra_args: tuple[str, ...] = (), reload: bool = True) -> Iterator[TensorBoard]:
    """A real ``tensorboard`` process serving ``logdir`` (a folder, or a bucket URL: its log
    goes to the temporary folder, the session's under pytest); waits until ``wait_runs`` runs
    are listed.

    ``reload=False`` for a logdir that is complete: TensorBoard reads it whole before it
    serves (``--reload_task blocking``) and never again, so no page sees a run half read.
    Otherwise it reads on every second, as it does while a training writes, and a run may be
    listed before all of its points are."""
    fd, name = tempfile.mkstemp(prefix="tensorboard-", suffix=".log",
                                dir=logdir.parent if isinstance(logdir, Path) else None)
    log_path = Path(name)
    args = [
        sys.executable, "-c", NO_TF_TENSORBOARD, "--logdir", str(logdir),
        "--host", "127.0.0.1", "--port", "0", "--load_fast=false",
        *(("--reload_interval", "1") if reload else
          ("--reload_interval", "0", "--reload_task", "blocking")),
        *extra_args,
    ]
    if path_prefix:
        args += ["--path_prefix", path_prefix]
    log = os.fdopen(fd, "wb")
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=str(REPO))
    try:
        port = served_port(proc, name, time.monotonic() + 90)
    except BaseException:
        proc.kill()
        proc.wait()
        log.close()
        raise
    tb = TensorBoard(f"http://127.0.0.1:{port}{path_prefix}/", proc, log_path)
    try:
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                raise RuntimeError("tensorboard exited:\n" + log_path.read_text()[-3000:])
            try:
                if len(tb.get_json("runs")["runs"]) >= wait_runs:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("tensorboard not ready:\n" + log_path.read_text()[-3000:])
            time.sleep(0.3)
        yield tb
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()  # reap it: a killed, unwaited child stays a zombie
        log.close()


def launch_chromium(playwright):
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)


def next_paint(frame) -> None:
    """Returns once the page has drawn two more frames: what a mouse move or a resize set
    off (a cursor readout, a chart redrawn at a new size) is on screen by then."""
    frame.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")


def plugin_frame(page, timeout_s: float = 30.0):
    """The Introspect iframe inside the TensorBoard page."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for frame in page.frames:
            if "plugin_entry.html?name=introspect" in frame.url:
                return frame
        page.wait_for_timeout(100)
    raise TimeoutError("the Introspect iframe did not appear; frames: "
                       + ", ".join(f.url for f in page.frames))
