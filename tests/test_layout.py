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


def test_every_test_path_the_code_and_docs_name_exists() -> None:
    """A docstring or a document that sends the reader to a test names a file that is there."""
    import re

    repo = TESTS.parent
    sources = [p for folder in ("tb_introspect", "docs", "benchmarks", "demo")
               for p in (repo / folder).rglob("*") if p.suffix in (".py", ".md")]
    sources += [repo / "README.md", repo / "Makefile"]
    named = {(src.relative_to(repo).as_posix(), path) for src in sources
             for path in re.findall(r"\btests/[\w/]+\.py\b", src.read_text(encoding="utf-8"))}
    assert sorted((src, path) for src, path in named if not (repo / path).is_file()) == []
