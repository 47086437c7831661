"""The README's Python examples run as written, and its commands exist.

Each ```python block runs in a fresh interpreter in a temporary directory, then
the event files it wrote are read back through the read side (``tb_introspect.read``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tb_introspect.read import provider

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")
BLOCKS = re.findall(r"```python\n(.*?)```", README, flags=re.S)


def test_readme_has_examples() -> None:
    assert len(BLOCKS) >= 3
    # the quickstarts a newcomer copies are the ones that run here
    for module in ("tb_introspect.keras", "tb_introspect.torch", "tb_introspect.transformers",
                   "tb_introspect.lightning"):
        assert any(f"from {module} import" in block for block in BLOCKS), module


def test_readme_stays_short() -> None:
    # read in five minutes: measurements go to docs/benchmarks.md, options to docs/options.md
    assert len(README.splitlines()) <= 300


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs_and_logs(index: int, tmp_path: Path) -> None:
    code = BLOCKS[index]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    logdir = re.search(r'"(logs/[^"]+)"', code).group(1)
    runs = provider.read_logdir(str(tmp_path / logdir))
    assert runs, f"example {index} wrote no tb-introspect data to {logdir}"
    series = next(iter(runs.values())).all_series()
    assert any(tag.startswith("introspect/metric/loss") for tag in series)
    assert any("/variable/" in tag for tag in series)


def test_readme_commands_exist() -> None:
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^\s*make (\w[\w-]*)", README, flags=re.M))
    assert {"demo", "test"} <= targets, targets  # the two commands a fresh machine needs
    for target in targets:
        assert re.search(rf"^{target}:", makefile, flags=re.M), f"make {target} missing"
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert "make test" in ci
