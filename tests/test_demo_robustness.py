"""The demo's stories on other CPUs: a slice of the robustness matrix
(``tb_introspect.demo.robustness``; ``benchmarks/demo_robustness.py`` runs all of it).

Each cell trains the quick demo of one framework in a fresh process with another seed,
thread count or kernel path than the suite's own demos (seed 0, one thread, this CPU's
kernels), and every run must tell its story with margin and keep a finite loss.
``TB_INTROSPECT_DEMO_MATRIX=full`` runs every cell instead of the slice.
"""

from __future__ import annotations

import os

import pytest

from tb_introspect.demo.models import scenario_names
from tb_introspect.demo.robustness import Cell, matrix, run_cell

#: One cell per kernel path that is not this machine's own, each with another seed; two
#: threads where the framework splits its work by them.
SLICE = (
    Cell("torch", seed=1, threads=2, path="aten-avx2"),
    Cell("torch", seed=2, threads=1, path="aten-default"),
    Cell("keras", seed=3, threads=2, path="onednn-off"),
)
CELLS = matrix() if os.environ.get("TB_INTROSPECT_DEMO_MATRIX") == "full" else SLICE


@pytest.mark.slow
@pytest.mark.parametrize("cell", CELLS, ids=lambda c: c.label)
def test_every_story_holds_in_the_cell(cell: Cell) -> None:
    outcome = run_cell(cell)
    assert not outcome.error, outcome.error
    assert sorted(outcome.problems) == sorted(scenario_names())
    failing = {name: (p, outcome.numbers[name]) for name, p in outcome.problems.items() if p}
    assert not failing, failing
