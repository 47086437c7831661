"""Session fixtures: the real trainings that several test modules read, trained once."""

from __future__ import annotations

from pathlib import Path

import pytest
from shared_runs import APP_RUN, CLI, Trained, link_runs, train_shared


@pytest.fixture(scope="session")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Trained:
    """The quick demo and a MobileNetV2, trained together (about 3 minutes on 2 cores)."""
    if CLI is None:
        pytest.skip("console script not installed (pip install -e .)")
    return train_shared(tmp_path_factory.mktemp("trained"))


@pytest.fixture(scope="session")
def real_logdir(trained: Trained, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One logdir with the demo's four runs and the MobileNetV2 run."""
    runs = {p.name: p for p in sorted(trained.demo.iterdir()) if p.is_dir()}
    return link_runs({**runs, APP_RUN: trained.app}, tmp_path_factory.mktemp("real"))
