"""The test tree's layout keeps imports unambiguous (see pyproject.toml's pytest section)."""

from __future__ import annotations

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def test_every_folder_pytest_imports_from_is_a_package() -> None:
    # A folder without __init__.py goes on sys.path under pytest's prepend import mode: then
    # tests/torch would be imported as torch, and same-named files in two folders collide.
    folders = {p.parent for pattern in ("test_*.py", "conftest.py") for p in TESTS.rglob(pattern)}
    assert sorted(str(f.relative_to(TESTS.parent)) for f in folders
                  if not (f / "__init__.py").is_file()) == []


def test_no_test_folder_is_on_sys_path() -> None:
    on_path = {Path(p).resolve() for p in sys.path if p}
    assert sorted(str(f) for f in on_path if f == TESTS or TESTS in f.parents) == []


def test_torch_is_the_real_package() -> None:
    import importlib.util

    spec = importlib.util.find_spec("torch")
    assert spec is None or TESTS not in Path(spec.origin or "").resolve().parents
