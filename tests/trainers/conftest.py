"""The trainer runs, trained once per test session (shared by pytest-xdist's workers under
a file lock: ``shared_runs.once``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.shared_runs import once


def shared(tmp_path_factory: pytest.TempPathFactory, name: str, train) -> dict[str, Path]:
    """``train(root) -> {run: dir}``, run once for every worker of this session."""
    runs = once(tmp_path_factory, name, lambda root: {k: str(v) for k, v in train(root).items()})
    return {k: Path(v) for k, v in runs.items()}


def _train_hf(root: Path) -> dict[str, Path]:
    from tests.trainers import hf_support as hs

    runs = {}
    for name, train, lr in (("gpt2", hs.train_gpt2, hs.GPT_LR),
                            ("gpt2_lr_x100", hs.train_gpt2, 100 * hs.GPT_LR),
                            ("bert", hs.train_bert, hs.BERT_LR),
                            ("bert_lr_x100", hs.train_bert, 100 * hs.BERT_LR)):
        train(root / name, lr)
        runs[name] = hs.run_dir(root / name)
    return runs


@pytest.fixture(scope="session")
def hf_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny GPT-2 and BERT, each healthy and with a learning rate 100x too high: their
    TensorBoard run folders (``report_to="tensorboard"``'s and ``IntrospectCallback``'s)."""
    return shared(tmp_path_factory, "hf_runs", _train_hf)


def _train_lightning(root: Path) -> dict[str, Path]:
    import subprocess
    import sys

    from tests.trainers import lightning_support as ls

    runs = {}
    for name, lr in (("cnn", ls.LR), ("cnn_lr_x100", 100 * ls.LR)):
        trainer = ls.fit(root / name, lr)
        runs[name] = Path(trainer.logger.log_dir)
    # DDP on two CPU processes: Lightning's popen launcher starts the second rank as
    # another run of the same module.
    repo = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, "-m", "tests.trainers.lightning_support",
                        str(root / "ddp")], cwd=repo, capture_output=True, text=True,
                       timeout=600, env={**os.environ, "PYTHONPATH": str(repo)})
    assert r.returncode == 0, r.stderr[-3000:]
    runs["cnn_ddp"] = root / "ddp" / "lightning_logs" / "version_0"
    return runs


@pytest.fixture(scope="session")
def lightning_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The digits CNN fitted by Lightning (bf16-mixed, accumulate_grad_batches=2, gradient
    clipping): healthy, with a learning rate 100x too high, and healthy under DDP on two
    gloo processes: each one's ``TensorBoardLogger`` run folder."""
    return shared(tmp_path_factory, "lightning_runs", _train_lightning)
