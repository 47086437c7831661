"""Session fixtures: the real trainings that several test modules read, trained once.

``make test`` runs several pytest-xdist workers: ``shared_runs.once`` trains for all.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import schedule
from tests.shared_runs import APP_RUN, CLI, Trained, link_runs, once, train_shared

# The pytest-xdist workers share the machine's cores (two on the reference machine): one
# compute thread per process, inherited by every subprocess a test starts. With a pool per
# core in each, OpenMP and Eigen threads spin against the other worker's (a PyTorch and a
# Keras module side by side: 27 % less CPU, 18 % less wall with one thread each).
for _var in ("OMP_NUM_THREADS", "TF_NUM_INTRAOP_THREADS"):
    os.environ.setdefault(_var, "1")
# XLA's CPU compiles without LLVM's optimizations: the tests check what our graphs compute
# under XLA, which the HLO passes decide, not how fast the machine code runs. The
# eight tests that compile with XLA: 87 and 92 -> 60 and 68 CPU-seconds.
os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0")


def pytest_addoption(parser: pytest.Parser) -> None:
    schedule.addoption(parser)


def pytest_configure(config: pytest.Config) -> None:
    schedule.configure(config)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    schedule.order(items)


@pytest.fixture(scope="session", autouse=True)
def temporary_folder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The temporary folder of this process and every subprocess its tests start: one under
    pytest's base folder, which pytest rotates. What a test hands to ``tempfile`` (the public
    docstrings' examples write to ``tempfile.mkdtemp()``) then stays out of the machine's."""
    folder = str(tmp_path_factory.mktemp("tmp", numbered=False))
    before = os.environ.get("TMPDIR")
    os.environ["TMPDIR"], tempfile.tempdir = folder, folder
    yield
    tempfile.tempdir = None
    if before is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = before


@pytest.fixture(scope="session")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Trained:
    """The quick demo and a MobileNetV2, trained together (about 2 minutes on 2 cores)."""
    if CLI is None:
        pytest.skip("console script not installed (pip install -e .)")
    d = once(tmp_path_factory, "trained", train_shared)
    return Trained(Path(d["demo"]), d["demo_stderr"], Path(d["app"]))


@pytest.fixture(scope="session")
def real_logdir(trained: Trained, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One logdir with the demo's four runs and the MobileNetV2 run."""
    runs = {p.name: p for p in sorted(trained.demo.iterdir()) if p.is_dir()}
    return link_runs({**runs, APP_RUN: trained.app}, tmp_path_factory.mktemp("real"))


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium under Playwright, one per module: a crash or leak in one module's
    pages stays there."""
    from playwright.sync_api import sync_playwright

    from tests.browser.browser_support import launch_chromium

    with sync_playwright() as p:
        b = launch_chromium(p)
        yield b
        b.close()
