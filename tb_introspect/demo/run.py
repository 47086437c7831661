"""Train the demo scenarios into one TensorBoard logdir, with progress bars.

Each scenario becomes one run directory ``<logdir>/<index>_<scenario>`` (the index keeps
TensorBoard's alphabetical run list in demo order). When those names are taken, for example
by an earlier demo, every run of this demo gets the same ``_<n>`` suffix (the smallest free
one), so older runs are never overwritten and the runs of one demo stay recognisable.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Sequence
from typing import Any, TextIO

from tb_introspect.demo.data import load_digits
from tb_introspect.demo.models import (
    BATCH_SIZE,
    EPOCHS,
    SCENARIOS,
    RunResult,
    Scenario,
    get_scenario,
)


def run_names(logdir: str, scenarios: Sequence[Scenario]) -> list[str]:
    """Run directory names for ``scenarios`` that do not exist yet in ``logdir``."""
    # Numbered by the scenario's place in the full demo, also when only some are run.
    stems = [f"{SCENARIOS.index(s) + 1}_{s.name}" for s in scenarios]
    taken = set(os.listdir(logdir)) if os.path.isdir(logdir) else set()
    if not taken.intersection(stems):
        return stems
    n = 2
    while taken.intersection(f"{stem}_{n}" for stem in stems):
        n += 1
    return [f"{stem}_{n}" for stem in stems]


def prepare_logdir(logdir: str, scenarios: Sequence[Scenario]) -> list[str]:
    """Create ``logdir`` and one new, empty directory per scenario; return their paths.

    Raises ``NotADirectoryError`` when ``logdir`` is a file, ``OSError`` when it cannot be
    created or written. A directory that appears between choosing a name and creating it
    (another demo running at the same time) makes the names be chosen again.
    """
    if os.path.exists(logdir) and not os.path.isdir(logdir):
        raise NotADirectoryError(f"log directory {logdir!r} exists and is not a directory")
    os.makedirs(logdir, exist_ok=True)
    for _attempt in range(100):
        paths = [os.path.join(logdir, n) for n in run_names(logdir, scenarios)]
        created: list[str] = []
        try:
            for p in paths:
                os.mkdir(p)  # fails if it exists: nothing is ever reused
                created.append(p)
            return paths
        except FileExistsError:
            for p in created:
                os.rmdir(p)
    raise OSError(f"could not find free run names in {logdir!r}")


def _progress_callback(title: str, epochs: int, steps_per_epoch: int, stream: TextIO) -> Any:
    """A Keras callback drawing one tqdm bar (steps) with loss and accuracy."""
    import keras
    from tqdm.auto import tqdm

    class TqdmProgress(keras.callbacks.Callback):
        def on_train_begin(self, logs: dict | None = None) -> None:
            self.bar = tqdm(
                total=epochs * steps_per_epoch, desc=title, unit="step", file=stream,
                dynamic_ncols=True, mininterval=0.5, leave=True,
            )
            self.epoch = 0

        def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
            self.epoch = epoch

        def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
            self.bar.update(1)
            if logs and batch % 10 == 0:
                self.bar.set_postfix(epoch=f"{self.epoch + 1}/{epochs}",
                                     loss=f"{logs.get('loss', math.nan):.3f}", refresh=False)

        def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
            logs = logs or {}
            self.bar.set_postfix(
                epoch=f"{epoch + 1}/{epochs}", loss=f"{logs.get('loss', math.nan):.3f}",
                val_acc=f"{logs.get('val_accuracy', math.nan):.3f}", refresh=False,
            )

        def on_train_end(self, logs: dict | None = None) -> None:
            self.bar.close()

    return TqdmProgress()


def run_demo(
    logdir: str,
    *,
    epochs: int | None = None,
    quick: bool = False,
    scenarios: Sequence[str] | None = None,
    every: str | int = "epoch",
    seed: int = 0,
    progress: bool = True,
    stream: TextIO | None = None,
    framework: str = "keras",
    flax: str = "linen",
) -> list[RunResult]:
    """Train the demo scenarios into new runs of ``logdir``; return what each produced.

    Args:
        logdir: TensorBoard log directory (created; existing runs are kept).
        epochs: epochs per run; default 20, or each scenario's ``quick_epochs`` with
            ``quick``.
        quick: the fast variant used by tests (fewer epochs, same models and settings).
        scenarios: names of the scenarios to run (default: all four, in order).
        every: the ``Introspect`` cadence, ``"epoch"`` or a number of steps.
        seed: random seed for weights and batch order.
        progress: draw progress bars on ``stream``.
        stream: where progress goes (default ``sys.stderr``).
        framework: ``"keras"``, ``"torch"`` or ``"jax"`` (the same scenarios in PyTorch,
            ``demo/torch_run.py``, or in Flax, ``demo/jax_run.py``).
        flax: with ``framework="jax"``, Flax's ``"linen"`` or ``"nnx"`` API.
    """
    if framework not in ("keras", "torch", "jax"):
        raise ValueError(f"framework must be 'keras', 'torch' or 'jax', got {framework!r}")
    if flax not in ("linen", "nnx"):
        raise ValueError(f"flax must be 'linen' or 'nnx', got {flax!r}")
    chosen = [get_scenario(n) for n in scenarios] if scenarios else list(SCENARIOS)
    if epochs is not None and epochs < 1:
        raise ValueError(f"epochs must be at least 1, got {epochs}")
    stream = stream if stream is not None else sys.stderr
    paths = prepare_logdir(logdir, chosen)
    if framework in ("torch", "jax"):
        options: dict[str, Any] = {}
        if framework == "torch":
            from tb_introspect.demo.torch_run import train_scenarios
        else:
            from tb_introspect.demo.jax_run import train_scenarios

            options["flax"] = flax
        return train_scenarios(chosen, paths, load_digits(seed=seed), epochs=epochs,
                               quick=quick, every=every, seed=seed, progress=progress,
                               stream=stream, **options)

    # TensorFlow is imported only now: `tb-introspect --help` and `diagnose` stay fast.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras

    from tb_introspect.keras import Introspect

    data = load_digits(seed=seed)
    steps_per_epoch = math.ceil(len(data.x_train) / BATCH_SIZE)
    results = []
    for i, (scenario, path) in enumerate(zip(chosen, paths, strict=True), start=1):
        n_epochs = epochs or (scenario.quick_epochs if quick else EPOCHS)
        keras.utils.set_random_seed(seed)
        model, optimizer = scenario.build(n_epochs * steps_per_epoch)
        model.compile(
            optimizer=optimizer, loss="sparse_categorical_crossentropy", metrics=["accuracy"]
        )
        callbacks = [Introspect(path, every=every, seed=seed)]
        if progress:
            title = f"[{i}/{len(chosen)}] {os.path.basename(path)}"
            callbacks.append(_progress_callback(title, n_epochs, steps_per_epoch, stream))
        start = time.perf_counter()
        history = model.fit(
            data.x_train, data.y_train,
            validation_data=(data.x_val, data.y_val),
            batch_size=BATCH_SIZE, epochs=n_epochs, shuffle=True, verbose=0,
            callbacks=callbacks,
        )
        results.append(
            RunResult(
                scenario=scenario, run_name=os.path.basename(path), path=path, epochs=n_epochs,
                seconds=time.perf_counter() - start,
                history={k: [float(v) for v in vs] for k, vs in history.history.items()},
            )
        )
        # Free the graph of this model before the next one is built.
        keras.backend.clear_session()
    return results
