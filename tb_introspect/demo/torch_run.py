"""The demo scenarios trained with PyTorch (``tb-introspect demo --framework torch``): the
same digits, batches, epochs and models as the Keras demo, logged by
``tb_introspect.torch.Introspector`` into the same kind of runs."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TextIO

import numpy as np

from tb_introspect.demo.data import Digits
from tb_introspect.demo.loops import Run
from tb_introspect.demo.models import BATCH_SIZE, EPOCHS, RunResult, Scenario


def train_scenarios(
    chosen: Sequence[Scenario], paths: Sequence[str], data: Digits, *, epochs: int | None,
    quick: bool, every: str | int, seed: int, progress: bool, stream: TextIO,
) -> list[RunResult]:
    """Train each scenario into its run directory; the ``RunResult`` of each."""
    import torch
    import torch.nn.functional as F

    from tb_introspect.demo import torch_models
    from tb_introspect.torch import Introspector

    x_train = torch.from_numpy(np.moveaxis(data.x_train, -1, 1).copy())  # NCHW
    y_train = torch.from_numpy(data.y_train.astype(np.int64))
    x_val = torch.from_numpy(np.moveaxis(data.x_val, -1, 1).copy())
    y_val = torch.from_numpy(data.y_val.astype(np.int64))
    steps_per_epoch = math.ceil(len(x_train) / BATCH_SIZE)
    results = []
    for i, (scenario, path) in enumerate(zip(chosen, paths, strict=True), start=1):
        n_epochs = epochs or (scenario.quick_epochs if quick else EPOCHS)
        torch.manual_seed(seed)
        model, opt, sched, clip_norm = torch_models.build(scenario.name)
        order = torch.Generator().manual_seed(seed)
        run = Run(scenario, path, n_epochs, steps_per_epoch, index=f"[{i}/{len(chosen)}]",
                  progress=progress, stream=stream)
        # F.cross_entropy below: a from-logits cross-entropy (the findings read it).
        with Introspector(path, model, opt, every=every, seed=seed,
                          criterion={"task": "classification", "from_logits": True}) as intro:
            for _epoch in range(n_epochs):
                model.train()
                perm = torch.randperm(len(x_train), generator=order)
                losses = []
                for b in range(steps_per_epoch):
                    idx = perm[b * BATCH_SIZE:(b + 1) * BATCH_SIZE]
                    logits = model(x_train[idx])
                    loss = F.cross_entropy(logits, y_train[idx])
                    opt.zero_grad()
                    loss.backward()
                    if clip_norm is not None:
                        torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
                    opt.step()
                    if sched is not None:
                        sched.step()
                    accuracy = (logits.argmax(1) == y_train[idx]).float().mean()
                    intro.step(loss=loss, accuracy=accuracy)
                    losses.append(loss.detach())
                    run.stepped()
                model.eval()
                with torch.no_grad():
                    val_logits = model(x_val)
                    val_loss = float(F.cross_entropy(val_logits, y_val))
                    val_acc = float((val_logits.argmax(1) == y_val).float().mean())
                intro.end_epoch(val_loss=val_loss, val_accuracy=val_acc)
                run.epoch(float(torch.stack(losses).mean()), val_loss, val_acc)
        results.append(run.result())
    return results
