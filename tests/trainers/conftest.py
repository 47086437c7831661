"""The trainer runs, trained once per test session (shared by pytest-xdist's workers under
a file lock, like ``tests/conftest.py``'s)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from filelock import FileLock


def shared(tmp_path_factory: pytest.TempPathFactory, name: str, train) -> dict[str, Path]:
    """``train(root) -> {run: dir}``, run once for every worker of this session."""
    if "PYTEST_XDIST_WORKER" in os.environ:
        base = tmp_path_factory.getbasetemp().parent  # this session's, above every worker's
    else:
        base = tmp_path_factory.getbasetemp()
    root, done = base / name, base / f"{name}.json"
    with FileLock(str(base / f"{name}.lock")):
        if not done.is_file():
            runs = train(root)
            done.write_text(json.dumps({k: str(v) for k, v in runs.items()}))
    return {k: Path(v) for k, v in json.loads(done.read_text()).items()}


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
