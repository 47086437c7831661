"""``IntrospectCallback`` in a real ``transformers.Trainer``: a tiny GPT-2 (gradient
accumulation 2, clipping at norm 1) and a tiny BERT classifier, each healthy and with a
learning rate 100x too high, read back through ``diagnose``, the command line, a real
TensorBoard and headless Chromium."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tb_introspect import slots
from tb_introspect.diagnose import find_issues
from tests.plugin.plugin_testlib import wait_for
from tests.shared_runs import link_runs
from tests.torch import torch_support as ts
from tests.trainers import hf_support as hs

CLI = str(Path(sys.executable).with_name("tb-introspect"))
RUNS = ("gpt2", "gpt2_lr_x100", "bert", "bert_lr_x100")


@pytest.fixture(scope="module")
def logdir(hf_runs, tmp_path_factory) -> Path:
    return link_runs({name: hf_runs[name] for name in RUNS}, tmp_path_factory.mktemp("hf"))


def serious(run) -> set[str]:
    return {f.kind for f in find_issues(run) if f.severity in ("warning", "critical")}


def trainer_scalars(run_dir: Path) -> dict[str, dict[int, float]]:
    """What ``report_to="tensorboard"`` wrote into the same folder, read by TensorBoard's
    own event reader."""
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


def test_one_folder_with_the_trainers_own_scalars(hf_runs):
    for name in RUNS:
        files = sorted(p.name for p in hf_runs[name].iterdir())
        assert len(files) == 2 and all(f.startswith("events.out.tfevents") for f in files), files
        assert hf_runs[name].parent.name == "runs"  # <output_dir>/runs/<date>_<host>
    scalars = trainer_scalars(hf_runs["gpt2"])
    assert {"train/loss", "train/grad_norm", "eval/loss"} <= set(scalars)


def test_steps_are_optimizer_steps_and_names_are_module_names(hf_runs):
    run = ts.read_run(str(hf_runs["gpt2"]))
    assert set(run.tensors) == set(slots.VIEWS)
    total = hs.EPOCHS * hs.GPT_STEPS
    # One point per epoch at the optimizer step that ended it (micro-batches are not steps).
    for view in slots.VIEWS:
        for s in run.tensors[view]:
            assert list(s.steps) == [hs.GPT_STEPS * (e + 1) for e in range(hs.EPOCHS)], s.info.tag
    assert list(run.metrics["loss"].steps) == list(range(1, total + 1))
    outputs = [s.info.name for s in run.tensors["output"]]
    leaves = [n for n, m in hs.gpt2().named_modules() if next(m.children(), None) is None]
    # Every leaf module, by its module name, but the attention dropouts that
    # scaled_dot_product_attention leaves uncalled (one warning names them).
    assert sorted(outputs) == sorted(n for n in leaves if not n.endswith("attn.attn_dropout"))
    assert "transformer.h.1.attn.c_attn/weight" in {s.info.name for s in run.tensors["variable"]}
    by = ts.by_name(run, "output")
    # Sequence outputs are read features-last: GPT-2's Conv1D and the GELU after it too.
    assert by["transformer.h.0.mlp.c_fc"].info.shape[-1] == 256
    assert by["transformer.h.0.mlp.act"].info.shape[-1] == 256
    assert by["transformer.h.0.attn.c_attn"].info.shape[-1] == 192


def test_loss_lr_and_grad_norm_from_the_logs_eval_metrics_as_val(hf_runs):
    run = ts.read_run(str(hf_runs["gpt2"]))
    assert {"loss", "learning_rate", "grad_norm", "val_loss", "val_accuracy"} <= set(run.metrics)
    assert not {"epoch", "train_loss", "eval_runtime", "val_runtime", "total_flos"} & set(
        run.metrics), sorted(run.metrics)
    theirs = trainer_scalars(hf_runs["gpt2"])
    for ours, tag in (("loss", "train/loss"), ("grad_norm", "train/grad_norm"),
                      ("learning_rate", "train/learning_rate"), ("val_loss", "eval/loss")):
        s = run.metrics[ours]
        assert list(s.steps) == sorted(theirs[tag]), ours
        np.testing.assert_allclose(s.field("value"), [theirs[tag][k] for k in s.steps],
                                   rtol=1e-6, err_msg=ours)
    val = run.metrics["val_loss"]
    assert list(val.epochs) == list(range(hs.EPOCHS))
    assert list(val.steps) == [hs.GPT_STEPS * (e + 1) for e in range(hs.EPOCHS)]


def test_gradients_are_read_after_clipping(hf_runs):
    """Each optimizer step's gradient is clipped to norm 1 before the optimizer sees it: an
    epoch's gradient sum has norm <= its steps. Before clipping the same steps' norms
    (the trainer's ``grad_norm``) add up to far more."""
    run = ts.read_run(str(hf_runs["gpt2_lr_x100"]))
    grads = run.tensors["gradient"]
    clipped = np.sqrt(sum(s.field("l2") ** 2 for s in grads))
    norms = run.metrics["grad_norm"]
    before = [sum(v for v, e in zip(norms.field("value"), norms.epochs, strict=True) if e == k)
              for k in range(hs.EPOCHS)]
    assert np.all(clipped <= hs.GPT_STEPS * 1.0 * (1 + 1e-4)), clipped
    assert max(before) > 2 * hs.GPT_STEPS, before


@pytest.mark.parametrize(("healthy", "sick"), [("gpt2", "gpt2_lr_x100"),
                                               ("bert", "bert_lr_x100")])
def test_findings_healthy_and_lr_100x(hf_runs, healthy, sick):
    assert serious(ts.read_run(str(hf_runs[healthy]))) == set()
    assert "early_instability" in serious(ts.read_run(str(hf_runs[sick])))


def test_diagnose_command_reads_the_runs(logdir):
    r = subprocess.run([CLI, "diagnose", str(logdir), "--json"], capture_output=True,
                       text=True, timeout=300, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert r.returncode in (0, 1), r.stderr[-2000:]
    kinds = {run["run"]: {f["kind"] for f in run["findings"]
                          if f["severity"] in ("warning", "critical")}
             for run in json.loads(r.stdout)["runs"]}
    assert sorted(kinds) == sorted(RUNS)
    assert kinds["gpt2"] == set() and kinds["bert"] == set()
    assert "early_instability" in kinds["gpt2_lr_x100"] & kinds["bert_lr_x100"]


@pytest.fixture(scope="module")
def hf_tb(logdir):
    from tests.browser.browser_support import tensorboard

    with tensorboard(logdir, wait_runs=len(RUNS), reload=False) as server:
        yield server


def loaded(tb, last: dict[str, int]) -> dict[str, dict]:
    """The plugin's run listing once every run is read up to its ``last`` step."""
    def listing():
        runs = {r["run"]: r for r in tb.get_json("runs")["runs"]}
        done = all(runs.get(n, {}).get("max_step") == step for n, step in last.items())
        return runs if done else None
    return wait_for(listing, timeout=120)


def test_tensorboard_shows_the_tab_beside_the_trainers_scalars(hf_tb):
    gpt, bert = hs.EPOCHS * hs.GPT_STEPS, hs.EPOCHS * hs.BERT_STEPS
    listed = loaded(hf_tb, {"gpt2": gpt, "gpt2_lr_x100": gpt, "bert": bert,
                            "bert_lr_x100": bert})
    assert sorted(listed) == sorted(RUNS)
    for name in RUNS:
        assert all(listed[name]["views"].get(v) for v in slots.VIEWS), listed[name]
    def scalars():  # the trainer's own event file may be read after the tab's
        with urllib.request.urlopen(hf_tb.url + "data/plugin/scalars/tags", timeout=30) as r:
            tags = json.loads(r.read())
        return "train/loss" in tags.get("gpt2", {}) and "eval/loss" in tags.get("bert", {})

    assert wait_for(scalars, timeout=120)
    kinds = {f["kind"] for f in hf_tb.get_json("findings?run=gpt2_lr_x100")["findings"]}
    assert "early_instability" in kinds



@pytest.mark.browser
def test_the_tab_draws_the_gpt2_run(browser, hf_tb):
    from tests.browser.browser_session import Probe

    p = Probe(browser, hf_tb, embedded=False)
    try:
        p.open("p.introspect.run=gpt2")
        p.check("overview", "gpt2")
        p.sweep_layers("gpt2", slots.VIEWS)
    finally:
        p.close()


def test_on_finding_stop_ends_the_training_through_the_trainer(tmp_path: Path, caplog):
    """The trainer's own stop, not an exception out of its loop: ``train()`` returns, the
    finding named in the log, fewer optimizer steps than asked."""
    with caplog.at_level("WARNING", logger="tb_introspect"):
        trainer = hs.train_gpt2(tmp_path, 100 * hs.GPT_LR, on_finding="stop")
    assert trainer.state.global_step < hs.EPOCHS * hs.GPT_STEPS
    assert any("stopping training" in r.getMessage() for r in caplog.records), caplog.text


def test_a_step_based_run_gets_windows_readable_while_it_trains(tmp_path: Path):
    """``max_steps=300`` over an ``IterableDataset`` with ``logging_steps=10`` and
    ``every="auto"`` (the default) without a budget (``overhead=None``: the planned windows,
    not paced): windows of 10 steps (300 / 20, aligned to the logging interval), each point
    readable from the event file while training goes on."""
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from tb_introspect.transformers import IntrospectCallback

    data = hs.lm_data(64, 0)

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            while True:
                yield from (data[i] for i in range(len(data)))

    seen: dict[int, list[int]] = {}

    class ReadMidway(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 150:
                run = ts.read_run(str(tmp_path / "tb"))
                seen[150] = [int(s) for s in run.tensors["gradient"][0].steps]

    torch.manual_seed(0)
    args = TrainingArguments(
        str(tmp_path / "out"), max_steps=300, per_device_train_batch_size=4,
        learning_rate=hs.GPT_LR, logging_steps=10, save_strategy="no", report_to="none",
        use_cpu=True, disable_tqdm=True, dataloader_num_workers=0, seed=0)
    Trainer(model=hs.gpt2(), args=args, train_dataset=Stream(),
            callbacks=[IntrospectCallback(tmp_path / "tb", overhead=None), ReadMidway()]).train()
    run = ts.read_run(str(tmp_path / "tb"))
    grad = run.tensors["gradient"][0]
    assert grad.info.cadence == "window"
    assert list(grad.steps) == list(range(10, 301, 10))  # 30 points, one per window
    # While it trained: the windows up to the step before (a step is told to the
    # Introspector when the next one begins), none later.
    assert seen[150] and seen[150][-1] >= 130 and max(seen[150]) <= 150, seen
    assert len(seen[150]) >= 10
    out = ts.by_name(run, "output")
    steps = next(iter(out.values())).field("steps")
    assert set(steps) == {10}
    # Every step's loss, though the trainer logs every 10 steps; one loss band per window.
    assert list(run.metrics["loss"].steps) == list(range(1, 301))
    assert len(run.metric_epochs["loss"]) == 30


def test_the_models_own_loss_is_recorded_where_it_is_certain(hf_runs):
    """GPT-2's LM head computes a cross-entropy over its logits from ``labels``; the BERT
    classifier's loss waits for the labels' dtype (``problem_type`` unset, 4 labels): not
    recorded."""
    from transformers import TrainingArguments

    from tb_introspect.transformers import model_loss

    info = ts.read_run(str(hf_runs["gpt2"])).loss_info
    assert info["name"] == "CrossEntropyLoss" and info["task"] == "classification"
    assert info["from_logits"] is True and info["label_smoothing"] == 0.0
    assert not ts.read_run(str(hf_runs["bert"])).loss_info
    # The Trainer's own label smoothing replaces the model's loss.
    args = TrainingArguments(str(hf_runs["bert"].parent / "args"), report_to=[],
                             label_smoothing_factor=0.1)
    assert model_loss(hs.gpt2(), args).label_smoothing == pytest.approx(0.1)
