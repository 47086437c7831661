"""``IntrospectCallback`` under the training practices a ``transformers.Trainer`` user
takes: a ``compute_loss`` override, bf16 autocast, gradient accumulation and a resume from
a checkpoint, each a real training of the tiny GPT-2 read back from its event files."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.torch import torch_support as ts
from tests.trainers import hf_support as hs

TOTAL = hs.EPOCHS * hs.GPT_STEPS


def logged_losses(trainer) -> dict[int, float]:
    """The trainer's own per-step ``loss`` logs (``logging_steps=1``)."""
    return {h["step"]: h["loss"] for h in trainer.state.log_history if "loss" in h}


def doubled_trainer():
    """A ``Trainer`` whose ``compute_loss`` is its own: twice the next-token
    cross-entropy, computed from the logits (the model is given no labels). It keeps what it
    returned in training, by the optimizer step it was for."""
    from transformers import Trainer

    class Doubled(Trainer):
        loss_is_scaled_for_ga = False  # a per-batch mean: the trainer averages micro-batches

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.returned: dict[int, list[float]] = {}

        def compute_loss(self, model, inputs, return_outputs=False, **kw):
            outputs = model(input_ids=inputs["input_ids"])
            logits = outputs.logits[:, :-1].float()
            loss = 2 * F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                       inputs["labels"][:, 1:].reshape(-1))
            if model.training:
                step = self.state.global_step + 1
                self.returned.setdefault(step, []).append(float(loss.detach()))
            return (loss, outputs) if return_outputs else loss

    return Doubled


def test_a_compute_loss_override_is_the_loss_of_every_step(tmp_path: Path):
    """Each optimizer step's loss is the override's, its two micro-batches averaged once
    (gradient accumulation 2), though the trainer logs only every 5 steps (the mean of
    the same values); the model's cross-entropy is not declared as the criterion, and the
    trainer gets its ``training_step`` back."""
    from tb_introspect.transformers import IntrospectCallback

    every = 5
    trainer = hs.gpt2_trainer(tmp_path / "out", doubled_trainer(),
                              [IntrospectCallback(tmp_path / "tb", every="epoch")],
                              logging_steps=every)
    trainer.train()
    run = ts.read_run(str(tmp_path / "tb"))
    loss = run.metrics["loss"]
    assert list(loss.steps) == list(range(1, TOTAL + 1))
    assert all(len(trainer.returned[s]) == hs.ACCUMULATE for s in loss.steps)
    np.testing.assert_allclose(loss.field("value"),
                               [np.mean(trainer.returned[s]) for s in loss.steps], rtol=1e-6)
    theirs = logged_losses(trainer)
    assert sorted(theirs) == list(range(every, TOTAL + 1, every))
    ours = dict(zip(loss.steps, loss.field("value"), strict=True))
    np.testing.assert_allclose([theirs[s] for s in theirs],
                               [np.mean([ours[k] for k in range(s - every + 1, s + 1)])
                                for s in theirs], rtol=1e-6)
    assert not run.loss_info  # the GPT-2's own cross-entropy is not what is trained
    assert "training_step" not in vars(trainer)
    # The gradients are those of the same steps: one point per epoch.
    assert list(run.tensors["gradient"][0].steps) == [hs.GPT_STEPS * (e + 1)
                                                      for e in range(hs.EPOCHS)]


def test_bf16_autocast_outputs_and_the_steps_loss(tmp_path: Path):
    """``bf16=True`` on the CPU: the linear layers' outputs are read as autocast made them
    (bfloat16), the layer norms' in float32; the loss is each step's, as the trainer
    logs it; every gradient point finite."""
    from tb_introspect.transformers import IntrospectCallback

    trainer = hs.gpt2_trainer(tmp_path / "out", None,
                              [IntrospectCallback(tmp_path / "tb", every="epoch")],
                              bf16=True, num_train_epochs=1)
    trainer.train()
    run = ts.read_run(str(tmp_path / "tb"))
    by = ts.by_name(run, "output")
    assert by["transformer.h.0.attn.c_attn"].info.dtype == "bfloat16"
    assert by["transformer.h.0.ln_1"].info.dtype == "float32"
    loss = run.metrics["loss"]
    assert list(loss.steps) == list(range(1, hs.GPT_STEPS + 1))
    theirs = logged_losses(trainer)
    np.testing.assert_allclose(loss.field("value"), [theirs[s] for s in loss.steps], rtol=1e-6)
    grads = run.tensors["gradient"]
    assert all(list(s.steps) == [hs.GPT_STEPS] for s in grads)
    assert all(np.isfinite(s.field("l2")).all() and s.field("l2")[0] > 0 for s in grads)


def test_a_resumed_training_continues_the_run(tmp_path: Path):
    """Stopped after step 8 (mid-epoch 1, a checkpoint there), then resumed from it into
    the same folder: every step's loss once, at its own step and epoch, equal to the
    trainer's logs; the stopped training's last point at its stop, the resumed one's at
    its epochs' ends, none written twice."""
    from transformers import TrainerCallback

    from tb_introspect.transformers import IntrospectCallback

    stop = hs.GPT_STEPS + 2

    class StopAt(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == stop:
                control.should_training_stop = True

    def trainer(*callbacks):
        return hs.gpt2_trainer(tmp_path / "out", None, [
            IntrospectCallback(tmp_path / "tb", every="epoch"), *callbacks],
            save_strategy="steps", save_steps=stop)

    first = trainer(StopAt())
    first.train()
    assert first.state.global_step == stop
    resumed = trainer()
    resumed.train(resume_from_checkpoint=str(tmp_path / "out" / f"checkpoint-{stop}"))
    assert resumed.state.global_step == TOTAL
    assert len(list((tmp_path / "tb").glob("events.out.tfevents.*"))) == 2
    run = ts.read_run(str(tmp_path / "tb"))
    loss = run.metrics["loss"]
    assert list(loss.steps) == list(range(1, TOTAL + 1))
    assert list(loss.epochs) == [(s - 1) // hs.GPT_STEPS for s in loss.steps]
    theirs = logged_losses(resumed)  # the checkpoint's log history, then the resumed steps
    np.testing.assert_allclose(loss.field("value"), [theirs[s] for s in loss.steps], rtol=1e-6)
    for s in run.tensors["gradient"]:
        assert list(s.steps) == [hs.GPT_STEPS, stop, 2 * hs.GPT_STEPS, TOTAL], s.info.tag
        assert list(s.epochs) == [0, 1, 1, 2], s.info.tag
        # The previous point's gradient sum is not in the checkpoint: no cosine at the
        # first point of each training.
        cos = s.field("cos_prev")
        assert np.isnan(cos[[0, 2]]).all() and np.isfinite(cos[[1, 3]]).all(), s.info.tag
    for s in run.tensors["variable"]:  # the update since the weights it resumed from
        assert np.isfinite(s.field("update_ratio")).all(), s.info.tag


def test_a_fused_optimizer_is_read_before_its_step(tmp_path: Path):
    """``optim="adamw_torch_fused"`` (one fused kernel for the whole update): the gradients
    are read in the optimizer's step pre-hook, so each epoch's gradient sums are those of
    the same training with the multi-tensor AdamW, up to the two kernels' rounding."""
    from tb_introspect.transformers import IntrospectCallback

    runs = {}
    for optim in ("adamw_torch_fused", "adamw_torch"):
        trainer = hs.gpt2_trainer(tmp_path / optim, None,
                                  [IntrospectCallback(tmp_path / optim / "tb", every="epoch")],
                                  optim=optim, num_train_epochs=1)
        trainer.train()
        inner = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
        assert bool(inner.defaults.get("fused")) == (optim == "adamw_torch_fused")
        runs[optim] = ts.by_name(ts.read_run(str(tmp_path / optim / "tb")), "gradient")
    fused, plain = runs["adamw_torch_fused"], runs["adamw_torch"]
    assert set(fused) == set(plain) and fused
    for name, s in fused.items():
        assert list(s.steps) == [hs.GPT_STEPS], name
        np.testing.assert_allclose(s.field("l2"), plain[name].field("l2"), rtol=1e-3,
                                   err_msg=name)


def test_without_its_trainer_the_logged_loss_is_taken_and_said_once(tmp_path: Path):
    """Events that no ``Trainer`` sends (the callback driven by hand): one warning names
    the loss used, the trainer's logged ``loss``, which is what is written."""
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from tb_introspect.transformers import IntrospectCallback

    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    args = TrainingArguments(str(tmp_path / "out"), report_to="none", use_cpu=True)
    cb = IntrospectCallback(tmp_path / "tb", every=2)
    logged = {}
    for run in range(2):
        state, control = TrainerState(global_step=3 * run), TrainerControl()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            cb.on_train_begin(args, state, control, model=model, optimizer=opt)
        said = [w for w in caught if "Trainer running it was not found" in str(w.message)]
        assert len(said) == (1 if run == 0 else 0), [str(w.message) for w in caught]
        for _ in range(3):
            cb.on_step_begin(args, state, control)
            loss = model(torch.randn(16, 4)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            state.global_step += 1
            cb.on_step_end(args, state, control)
            logged[state.global_step] = 10.0 + state.global_step
            cb.on_log(args, state, control, logs={"loss": logged[state.global_step]})
        cb.on_train_end(args, state, control)
    loss = ts.read_run(str(tmp_path / "tb")).metrics["loss"]
    assert list(loss.steps) == list(range(1, 7))
    assert list(loss.field("value")) == pytest.approx([logged[s] for s in loss.steps])
