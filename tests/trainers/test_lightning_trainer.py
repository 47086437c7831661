"""``IntrospectCallback`` in a real Lightning ``Trainer``: a CNN on scikit-learn's digits with
``precision="bf16-mixed"``, ``accumulate_grad_batches=2`` and ``gradient_clip_val=1``,
healthy, with a learning rate 100x too high, and under ``strategy="ddp"`` on two gloo
processes; read back through ``diagnose``, a real TensorBoard and headless Chromium."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tb_introspect import slots
from tb_introspect.diagnose import find_issues
from tests.shared_runs import link_runs
from tests.torch import torch_support as ts
from tests.trainers import lightning_support as ls

RUNS = ("cnn", "cnn_lr_x100", "cnn_ddp")
LAST = ls.EPOCHS * ls.STEPS
POINTS = [ls.STEPS * (e + 1) for e in range(ls.EPOCHS)]


def serious(run) -> set[str]:
    return {f.kind for f in find_issues(run) if f.severity in ("warning", "critical")}


def test_writes_into_the_loggers_run_folder(lightning_runs):
    for name in RUNS:
        folder = lightning_runs[name]
        assert folder.name == "version_0" and folder.parent.name == "lightning_logs"
        events = [p for p in folder.iterdir() if p.name.startswith("events.out.tfevents")]
        # the logger's own file and the tab's (under DDP too: rank 0 alone writes)
        assert len(events) == 2, events
        assert not (folder.parent / "version_1").exists()
    acc = EventAccumulator(str(lightning_runs["cnn"]))
    acc.Reload()
    assert {"val_loss", "val_accuracy"} <= set(acc.Tags()["scalars"])


def test_optimizer_steps_bf16_outputs_and_validation_metrics(lightning_runs):
    run = ts.read_run(str(lightning_runs["cnn"]))
    assert set(run.tensors) == set(slots.VIEWS)
    for view in slots.VIEWS:
        for s in run.tensors[view]:
            assert list(s.steps) == POINTS, s.info.tag
    loss = run.metrics["loss"]
    assert list(loss.steps) == list(range(1, LAST + 1))
    # Two micro-batches of a step, each scaled by 1/2 by Lightning, add up to the step's
    # loss: the first is near ln 10, not half of it.
    assert 1.8 < loss.field("value")[0] < 3.5
    by = ts.by_name(run, "output")
    assert by["features.0"].info.dtype == "bfloat16"  # autocast's, as the model ran
    assert by["features.0"].info.shape[1:] == (8, 8, 16)
    assert {"features.2", "head.3"} <= set(by)
    for name in ("val_loss", "val_accuracy"):
        s = run.metrics[name]
        assert list(s.epochs) == list(range(ls.EPOCHS)) and list(s.steps) == POINTS, name
    assert run.metrics["val_accuracy"].field("value")[-1] > 0.8
    assert "learning_rate" in run.metrics


def test_gradients_are_read_after_clipping(lightning_runs):
    """``gradient_clip_val=1``: each step's gradient has norm <= 1 when the optimizer
    applies it, so an epoch's gradient sum has norm <= its steps. The twin's loss jumps
    two orders of magnitude: unclipped, its first epoch's gradients would be far larger."""
    run = ts.read_run(str(lightning_runs["cnn_lr_x100"]))
    norm = np.sqrt(sum(s.field("l2") ** 2 for s in run.tensors["gradient"]))
    assert np.all(norm <= ls.STEPS * (1 + 1e-3)), norm


def test_findings_healthy_and_lr_100x(lightning_runs):
    assert serious(ts.read_run(str(lightning_runs["cnn"]))) == set()
    assert serious(ts.read_run(str(lightning_runs["cnn_ddp"]))) == set()
    # Its zero gradients are a warning; whether the dead share (counted on the statistics
    # steps of a layer after the ReLU) is a warning or an info is the CPU's rounding on this
    # short run: it is reported either way.
    sick = find_issues(ts.read_run(str(lightning_runs["cnn_lr_x100"])))
    kinds = {f.kind for f in sick}
    warned = {f.kind for f in sick if f.severity in ("warning", "critical")}
    assert "zero_gradients" in warned and "dead_units" in kinds, [
        (f.severity, f.kind) for f in sick]


def test_ddp_statistics_cover_both_ranks(lightning_runs):
    """Each rank trains on half of every batch; a point's output counts are both halves'."""
    run = ts.read_run(str(lightning_runs["cnn_ddp"]))
    assert list(run.metrics["loss"].steps) == list(range(1, LAST + 1))
    head = ts.by_name(run, "output")["head.4"]  # the logits: 10 per sample
    assert list(head.steps) == POINTS
    counts = head.field("count")
    np.testing.assert_array_equal(counts, [ls.TRAIN * 10] * ls.EPOCHS)


@pytest.fixture(scope="module")
def lightning_tb(lightning_runs, tmp_path_factory):
    from tests.browser.browser_support import tensorboard

    logdir = link_runs({n: lightning_runs[n] for n in RUNS}, tmp_path_factory.mktemp("pl"))
    with tensorboard(logdir, wait_runs=len(RUNS), reload=False) as server:
        yield server


def test_tensorboard_serves_the_runs_and_findings(lightning_tb):
    from tests.plugin.plugin_testlib import wait_for

    listed = wait_for(lambda: (lambda r: r if all(r.get(n, {}).get("max_step") == LAST
                                                 for n in RUNS) else None)(
        {r["run"]: r for r in lightning_tb.get_json("runs")["runs"]}), timeout=120)
    for name in RUNS:
        assert all(listed[name]["views"].get(v) for v in slots.VIEWS), listed[name]
    kinds = {f["kind"] for f in lightning_tb.get_json("findings?run=cnn_lr_x100")["findings"]}
    assert "dead_units" in kinds



@pytest.mark.browser
def test_the_tab_draws_the_lightning_run(browser, lightning_tb):
    from tests.browser.browser_session import Probe

    p = Probe(browser, lightning_tb, embedded=False)
    try:
        p.open("p.introspect.run=cnn")
        p.check("overview", "cnn")
        p.sweep_layers("cnn", slots.VIEWS)
    finally:
        p.close()


def test_no_tensorboard_logger_writes_into_the_trainers_log_dir(tmp_path: Path):
    """With a CSV logger the tab's folder is the trainer's ``log_dir``."""
    import lightning as L
    from lightning.pytorch.loggers import CSVLogger

    from tb_introspect.lightning import IntrospectCallback

    trainer = L.Trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=0,
                        accelerator="cpu", logger=CSVLogger(str(tmp_path)),
                        callbacks=[IntrospectCallback(every=1)], enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    train, _ = ls.loaders()
    trainer.fit(ls.digits_cnn(), train)
    run = ts.read_run(trainer.log_dir)
    assert list(run.tensors["gradient"][0].steps) == [1, 2]


def test_on_finding_stop_ends_the_fit_through_the_trainer(tmp_path: Path, caplog):
    """``trainer.should_stop``, not an exception out of ``fit``: fewer epochs than asked,
    the finding named in the log."""
    with caplog.at_level("WARNING", logger="tb_introspect"):
        trainer = ls.fit(tmp_path, 100 * ls.LR, on_finding="stop")
    assert trainer.current_epoch < ls.EPOCHS
    assert any("stopping training" in r.getMessage() for r in caplog.records), caplog.text


def test_a_step_based_fit_gets_windows_readable_while_it_trains(tmp_path: Path):
    """``max_steps=100`` with ``log_every_n_steps=5`` and ``every="auto"`` (the default)
    without a budget (``overhead=None``: the planned windows, not paced): about 6 epochs,
    so windows of 5 steps (100 / 20, aligned to the logging interval) that also close at the
    epochs' ends, readable while it trains."""
    import lightning as L

    from tb_introspect.lightning import IntrospectCallback

    seen: dict[int, list[int]] = {}

    class ReadMidway(L.Callback):
        def on_train_batch_end(self, trainer, *args):
            # A window's point is written beside the next steps, at most one point waiting:
            # by step 60's window end the one of step 50 is on disk.
            if trainer.global_step == 60 and 60 not in seen:
                run = ts.read_run(str(tmp_path / "tb"))
                seen[60] = [int(s) for s in run.tensors["gradient"][0].steps]

    L.seed_everything(0, verbose=False)
    trainer = L.Trainer(max_steps=100, accelerator="cpu", logger=False,
                        callbacks=[IntrospectCallback(tmp_path / "tb", overhead=None),
                                   ReadMidway()],
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, log_every_n_steps=5, limit_val_batches=0)
    train, _ = ls.loaders()
    trainer.fit(ls.digits_cnn(), train)
    run = ts.read_run(str(tmp_path / "tb"))
    grad = run.tensors["gradient"][0]
    per_epoch = ls.TRAIN // ls.BATCH
    ends = sorted(set(range(5, 101, 5)) | set(range(per_epoch, 101, per_epoch)))
    assert grad.info.cadence == "window"
    assert list(grad.steps) == ends
    out = next(iter(ts.by_name(run, "output").values()))
    np.testing.assert_array_equal(out.field("steps"), np.diff([0, *ends]))
    # Written while it trained: the windows up to step 50 (the band at its end included).
    assert len(seen[60]) >= 10 and 50 in seen[60], seen


def test_points_that_the_budget_cannot_pay_come_at_epoch_ends_only(tmp_path: Path, caplog):
    """The same fit with a budget no point fits in (``overhead=1e-9``): the planned windows
    until the governor has timed what a window costs, then a point at each epoch's end only
    (the window paced past them), with one line that says why."""
    import lightning as L

    from tb_introspect.lightning import IntrospectCallback

    L.seed_everything(0, verbose=False)
    trainer = L.Trainer(max_steps=100, accelerator="cpu", logger=False,
                        callbacks=[IntrospectCallback(tmp_path / "tb", overhead=1e-9)],
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, log_every_n_steps=5, limit_val_batches=0)
    train, _ = ls.loaders()
    with caplog.at_level("INFO", logger="tb_introspect"):
        trainer.fit(ls.digits_cnn(), train)
    run = ts.read_run(str(tmp_path / "tb"))
    per_epoch = ls.TRAIN // ls.BATCH
    steps = list(run.tensors["gradient"][0].steps)
    ends = [*range(per_epoch, 100, per_epoch), 100]
    # planned windows of 5 until a statistics step and two points were timed (the first
    # step of a window is timed from its point's end, the first of each kind left out)
    assert steps[:2] == [5, 10] and set(steps) - set(ends) <= {5, 10, 15}, steps
    assert steps[-len(ends):] == ends, steps
    # every window's gradients summed over each of its steps: none lost between points
    out = next(iter(ts.by_name(run, "output").values()))
    assert out.field("steps").sum() == 100
    said = [r.getMessage() for r in caplog.records if "epoch ends only" in r.getMessage()]
    assert len(said) == 1, caplog.text


def test_a_loss_module_held_as_an_attribute_is_recorded(tmp_path: Path, lightning_runs):
    """``self.loss_fn = nn.CrossEntropyLoss(label_smoothing=0.1)`` is the module's loss, as
    a ``criterion=``; the CNN computing ``F.cross_entropy`` in ``training_step`` declares
    none, and none is recorded."""
    import lightning as L
    from lightning.pytorch.loggers import CSVLogger
    from torch import nn

    from tb_introspect.lightning import IntrospectCallback

    class WithLoss(ls._digits_cnn_class()):
        def __init__(self):
            super().__init__()
            self.loss_fn = nn.CrossEntropyLoss(label_smoothing=0.1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return self.loss_fn(self(x), y)

    trainer = L.Trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=0,
                        accelerator="cpu", logger=CSVLogger(str(tmp_path)),
                        callbacks=[IntrospectCallback(every=1)], enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    train, _ = ls.loaders()
    trainer.fit(WithLoss(), train)
    info = ts.read_run(trainer.log_dir).loss_info
    assert info["name"] == "CrossEntropyLoss" and info["task"] == "classification"
    assert info["from_logits"] is True and info["label_smoothing"] == pytest.approx(0.1)
    assert not ts.read_run(str(lightning_runs["cnn"])).loss_info
