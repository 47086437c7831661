"""Training overhead of the trainer integrations, on CPU: wall and CPU time.

Hugging Face: the tiny GPT-2 of the trainer tests (2 layers, width 64, vocabulary 128,
sequences of 16 tokens, batch 8) trained by ``transformers.Trainer`` for one epoch of 96
optimizer steps with

* ``report_to="tensorboard"`` (plain),
* the same plus ``IntrospectCallback()`` (default settings, all four views),
* the same with ``views=("variable", "gradient")`` (no layer-output hooks: what
  ``wandb.watch`` logs),
* ``report_to="wandb"`` with ``WANDB_WATCH=all`` (offline: ``WANDB_MODE=offline``; the
  callback watches with ``log_freq=max(100, logging_steps)``, about one epoch here).

Lightning: the digits CNN of the trainer tests (conv-BN-ReLU x2, pool, dense-BN-ReLU,
dense), batch 16, one epoch of 96 steps, with a ``TensorBoardLogger`` (plain), plus
``IntrospectCallback()``, plus ``IntrospectCallback(views=("variable", "gradient"))``,
and a ``WandbLogger`` (offline) with ``logger.watch(model, log="all", log_freq=96)``.

Each round trains every setup once for two epochs, from the same seed, in an order that
rotates every round; a warm-up round is left out. The second epoch is timed (wall and this
process's CPU; wandb's service process is not counted), from its first step to the end of
training, which includes the epoch's logged point and closing the writers: the steady
state, without the one-time start (model hooks, writers, wandb's run); the clock starts
once the first epoch's point, handed to the pipeline's worker at its end, is written (one
point per timed epoch, as in every later epoch of a longer run). Each figure is the
median over rounds of the per-round ratio to the plain setup. An IntrospectCallback row also gives
a later point's cost on the training thread (``Pipeline.log``'s CPU time, plus a statistics
step's over a lean step's, medians; the point's host work runs beside, on its worker) and
its added CPU time over ``wandb.watch``'s.

    python benchmarks/trainers_overhead.py --rounds 5          # the table of docs/benchmarks.md
    python benchmarks/trainers_overhead.py --quick --no-wandb  # a smoke run (16 steps)
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

STEPS = 96
EPOCHS = 2
TARGET = (1.05, 1.10)
#: The IntrospectCallback rows' added CPU time at most this many times ``wandb.watch``'s.
WANDB_TARGET = 1.5
#: A later point on the training thread, its statistics step included (ms).
POINT_TARGET_MS = {"hf": 15.0, "lightning": 10.0}
#: The views of ``wandb.watch(log="all")``: weights and gradients, no layer outputs.
WATCH_VIEWS = ("variable", "gradient")


class Clock:
    """The wall and CPU time of the last epoch, to the end of training."""

    def __init__(self) -> None:
        self.t0 = self.c0 = 0.0
        self.spent = (0.0, 0.0)

    def start(self) -> None:
        self.t0, self.c0 = time.perf_counter(), time.process_time()

    def stop(self) -> None:
        self.spent = (time.perf_counter() - self.t0, time.process_time() - self.c0)


CLOCK = Clock()
#: The setup running now: each logged point's seconds on the training thread, and each
#: training step's (from the end of one ``Introspector.step`` to the next: the point
#: left out) with whether it was a statistics step.
POINTS: list[float] = []
STEP_TIMES: list[tuple[bool, float]] = []


def time_points() -> Callable[[], None]:
    """Record every logged point's training-thread CPU time (its worker's part runs
    beside) and every step's, by phase; returns what puts the two methods back."""
    from tb_introspect.pipeline.governor import Phase
    from tb_introspect.pipeline.pipeline import Pipeline
    from tb_introspect.torch import Introspector

    log, step = Pipeline.log, Introspector.step

    def timed_log(self, at: int) -> None:
        t = time.thread_time()
        log(self, at)
        POINTS.append(time.thread_time() - t)

    def timed_step(self, *args, **kwargs) -> None:
        last = getattr(self, "_bench_step_end", None)
        if last is not None:
            STEP_TIMES.append((self.hooks.phase is Phase.STATS, time.thread_time() - last))
        step(self, *args, **kwargs)
        self._bench_step_end = time.thread_time()

    Pipeline.log, Introspector.step = timed_log, timed_step

    def restore() -> None:
        Pipeline.log, Introspector.step = log, step
    return restore


def settle(callbacks: list) -> None:
    """Wait for the IntrospectCallbacks' workers: the previous epoch's point, handed over
    at its end, is that epoch's cost (the timed epoch then pays its own point, which the
    close waits for, and no other)."""
    for cb in callbacks:
        intro = getattr(cb, "introspector", None)
        if intro is not None:
            intro.pipeline.worker.wait()


def point_ms() -> float | None:
    """A later point's cost on the training thread, its statistics step's extra time over
    a lean step included (medians, ms)."""
    stats = [t for full, t in STEP_TIMES if full]
    lean = [t for full, t in STEP_TIMES if not full]
    if len(POINTS) < 2 or not stats or not lean:
        return None
    extra = statistics.median(stats) - statistics.median(lean)
    return (statistics.median(POINTS[1:]) + extra) * 1e3


def hf_setups(root: Path, steps: int) -> dict[str, Callable[[], None]]:
    from transformers import Trainer, TrainerCallback, TrainingArguments

    class Timer(TrainerCallback):  # last in the list: after the others' events
        def __init__(self, others: list) -> None:
            self.others = others

        def on_epoch_begin(self, args, state, control, **kw):
            if state.epoch >= EPOCHS - 1:
                settle(self.others)
                CLOCK.start()

        def on_train_end(self, args, state, control, **kw):
            CLOCK.stop()

    from tb_introspect.transformers import IntrospectCallback
    from tests.trainers import hf_support as hs

    data = hs.lm_data(steps * hs.BATCH, 0)

    def run(name: str, report_to: str, callbacks: list) -> Callable[[], None]:
        def go() -> None:
            torch.manual_seed(0)
            out = tempfile.mkdtemp(dir=root, prefix=name)
            if report_to == "wandb":
                os.environ["WANDB_WATCH"] = "all"
                os.environ["WANDB_DIR"] = out
            args = TrainingArguments(
                out, num_train_epochs=EPOCHS, per_device_train_batch_size=hs.BATCH,
                learning_rate=hs.GPT_LR, logging_steps=10, save_strategy="no",
                report_to=report_to, use_cpu=True, disable_tqdm=True,
                dataloader_num_workers=0, seed=0)
            Trainer(model=hs.gpt2(), args=args, train_dataset=data,
                    callbacks=[*(others := [c() for c in callbacks]), Timer(others)]).train()
            if report_to == "wandb":
                import wandb

                os.environ.pop("WANDB_WATCH", None)
                wandb.finish()  # after the clock: the next setup starts a run of its own
        return go

    return {"report_to='tensorboard'": run("plain", "tensorboard", []),
            "+ IntrospectCallback()": run("intro", "tensorboard", [IntrospectCallback]),
            f"+ IntrospectCallback(views={WATCH_VIEWS})": run(
                "intro_watch", "tensorboard",
                [functools.partial(IntrospectCallback, views=WATCH_VIEWS)]),
            "report_to='wandb', WANDB_WATCH=all": run("wandb", "wandb", [])}


def lightning_setups(root: Path, steps: int) -> dict[str, Callable[[], None]]:
    import lightning as L
    from lightning.pytorch.loggers import TensorBoardLogger, WandbLogger

    class Timer(L.Callback):  # last in the list: after the others' hooks
        def on_train_epoch_start(self, trainer, pl_module):
            if trainer.current_epoch == EPOCHS - 1:
                settle(trainer.callbacks)
                CLOCK.start()

        def on_train_end(self, trainer, pl_module):
            CLOCK.stop()

    from tb_introspect.lightning import IntrospectCallback
    from tests.trainers import lightning_support as ls

    d = __import__("sklearn.datasets", fromlist=["load_digits"]).load_digits()
    x = torch.tensor(d.images / 16.0, dtype=torch.float32)[:, None][:steps * 16]
    y = torch.tensor(d.target)[:steps * 16]

    def run(name: str) -> Callable[[], None]:
        def go() -> None:
            L.seed_everything(0, verbose=False)
            out = tempfile.mkdtemp(dir=root, prefix=name)
            model = ls.digits_cnn()
            callbacks = {"intro": [IntrospectCallback(), Timer()],
                         "intro_watch": [IntrospectCallback(views=WATCH_VIEWS), Timer()]
                         }.get(name, [Timer()])
            if name == "wandb":
                logger = WandbLogger(save_dir=out, offline=True)
                logger.watch(model, log="all", log_freq=steps)
            else:
                logger = TensorBoardLogger(out)
            g = torch.Generator().manual_seed(0)
            loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y),
                                                 batch_size=16, shuffle=True, generator=g)
            L.Trainer(max_epochs=EPOCHS, accelerator="cpu", logger=logger, callbacks=callbacks,
                      enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, log_every_n_steps=10).fit(model, loader)
            if name == "wandb":
                logger.experiment.finish()
        return go

    return {"TensorBoardLogger": run("plain"), "+ IntrospectCallback()": run("intro"),
            f"+ IntrospectCallback(views={WATCH_VIEWS})": run("intro_watch"),
            "WandbLogger.watch(log='all')": run("wandb")}


def measure(setups: dict[str, Callable[[], None]], rounds: int, steps: int,
            warm_up: bool = True) -> dict[str, dict]:
    names = list(setups)
    times: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
    points: dict[str, list[float]] = {n: [] for n in names}
    for r in range(0 if warm_up else 1, rounds + 1):  # round 0 warms up
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            POINTS.clear()
            STEP_TIMES.clear()
            setups[n]()
            if r:
                times[n].append(CLOCK.spent)
                if (ms := point_ms()) is not None:
                    points[n].append(ms)
        print(f"round {r}: " + ", ".join(f"{n} {times[n][-1][0]:.2f}s" if r else n
                                         for n in names), file=sys.stderr, flush=True)
    plain = names[0]
    out = {}
    for n in names:
        wall = statistics.median(a[0] / b[0] for a, b in zip(times[n], times[plain],
                                                              strict=True))
        cpu = statistics.median(a[1] / b[1] for a, b in zip(times[n], times[plain],
                                                            strict=True))
        ms = statistics.median((a[1] - b[1]) / steps * 1e3
                               for a, b in zip(times[n], times[plain], strict=True))
        out[n] = {"wall": wall, "cpu": cpu, "cpu_ms_step": ms,
                  "plain_ms_step": statistics.median(b[0] for b in times[plain]) / steps * 1e3,
                  "point_ms": statistics.median(points[n]) if points[n] else None}
    return out


def table(title: str, result: dict[str, dict], point_target: float) -> str:
    """The setups' rows; an IntrospectCallback row also has a later point's training-thread ms
    (its statistics step included) and its added CPU time over ``wandb.watch``'s."""
    plain = next(iter(result.values()))["plain_ms_step"]
    watch = next((r for n, r in result.items() if "wandb" in n.lower()), None)
    rows = [f"| {title} (plain: {plain:.0f} ms/step) | wall | CPU | added CPU ms/step"
            f" | point ms (target ≤ {point_target:.0f}) | added vs wandb.watch |",
            "|---|---:|---:|---:|---:|---:|"]
    for n, r in list(result.items())[1:]:
        point = "" if r["point_ms"] is None else f"{r['point_ms']:.1f}"
        vs = ""
        if watch is not None and watch is not r:
            vs = (f"{r['cpu_ms_step'] / watch['cpu_ms_step']:.1f}x"
                  if watch["cpu_ms_step"] > 0 else "wandb adds none")
        rows.append(f"| {n} | {r['wall']:.2f}x | {r['cpu']:.2f}x | {r['cpu_ms_step']:.1f}"
                    f" | {point} | {vs} |")
    return "\n".join(rows)


def pick(setups: dict, a: argparse.Namespace) -> dict:
    return {n: f for n, f in setups.items() if not (a.no_wandb and "wandb" in n.lower())}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--only", choices=("hf", "lightning"), default=None)
    p.add_argument("--steps", type=int, default=STEPS, help="optimizer steps per epoch")
    p.add_argument("--quick", action="store_true", help="smoke run: one round of 16 steps")
    p.add_argument("--no-wandb", action="store_true", help="leave the wandb setups out")
    p.add_argument("--no-warm-up", action="store_true",
                   help="time the first round too (a smoke run: its figures include the"
                        " first-run costs)")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    rounds, steps = (1, 16) if a.quick else (a.rounds, a.steps)
    restore = time_points()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            if a.only in (None, "hf"):
                setups = hf_setups(root, steps)
                print(table("tiny GPT-2, transformers.Trainer",
                            measure(pick(setups, a), rounds, steps, not a.no_warm_up),
                            POINT_TARGET_MS["hf"]))
            if a.only in (None, "lightning"):
                setups = lightning_setups(root, steps)
                print(table("digits CNN, Lightning",
                            measure(pick(setups, a), rounds, steps, not a.no_warm_up),
                            POINT_TARGET_MS["lightning"]))
    finally:
        restore()
    print(f"targets for the IntrospectCallback() rows: <= {TARGET[1]}x CPU, <= {WANDB_TARGET}x"
          " wandb.watch's added CPU time, a later point <= the ms above")


if __name__ == "__main__":
    main()
