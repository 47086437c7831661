"""What the PyTorch and JAX demo loops share: a progress bar per run, the per-epoch history
and the ``RunResult`` of each run (the Keras demo gets them from ``fit``)."""

from __future__ import annotations

import os
import time
from typing import Any, TextIO

from tb_introspect.demo.models import RunResult, Scenario


class Run:
    """One scenario's loop: its progress bar (steps) and its history."""

    def __init__(self, scenario: Scenario, path: str, epochs: int, steps_per_epoch: int, *,
                 index: str, progress: bool, stream: TextIO) -> None:
        self.scenario, self.path, self.epochs = scenario, path, epochs
        self.history: dict[str, list[float]] = {"loss": [], "val_loss": [], "val_accuracy": []}
        self.bar: Any = None
        if progress:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=epochs * steps_per_epoch, unit="step", file=stream,
                            desc=f"{index} {os.path.basename(path)}", dynamic_ncols=True,
                            mininterval=0.5, leave=True)
        self.start = time.perf_counter()

    def stepped(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def epoch(self, loss: float, val_loss: float, val_accuracy: float) -> None:
        """An epoch ended: its mean training loss and its validation figures."""
        for key, value in (("loss", loss), ("val_loss", val_loss),
                           ("val_accuracy", val_accuracy)):
            self.history[key].append(float(value))
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{loss:.3f}", val_acc=f"{val_accuracy:.3f}",
                                 refresh=False)

    def result(self) -> RunResult:
        if self.bar is not None:
            self.bar.close()
        return RunResult(scenario=self.scenario, run_name=os.path.basename(self.path),
                         path=self.path, epochs=self.epochs,
                         seconds=time.perf_counter() - self.start, history=self.history)
