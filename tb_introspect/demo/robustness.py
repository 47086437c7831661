"""The demo's stories across seeds, thread counts and the kernel paths of other CPUs.

A cell of the matrix is one ``tb-introspect demo --quick`` of one framework, in a fresh
process whose environment picks the seed, the compute threads and the kernels the
framework would choose on another x86 CPU (``ATEN_CPU_CAPABILITY`` for PyTorch,
``TF_ENABLE_ONEDNN_OPTS`` and ``ONEDNN_MAX_CPU_ISA`` for TensorFlow, ``XLA_FLAGS``'
``--xla_cpu_max_isa`` for JAX). Each run of the cell
is judged twice: its findings must tell its scenario's story (``Scenario.story_problems``)
and its logged numbers must show the situation with a margin over what the findings need
(``evidence.margin_problems``); no run may log a non-finite loss.

``benchmarks/demo_robustness.py`` runs the whole matrix, or the cells it is given (the
test suite runs a slice through it).
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

#: Kernel paths per framework: what another x86 CPU makes the framework run, emulated here.
PATHS: dict[str, dict[str, dict[str, str]]] = {
    "torch": {
        "aten-default": {"ATEN_CPU_CAPABILITY": "default"},  # no vector ISA
        "aten-avx2": {"ATEN_CPU_CAPABILITY": "avx2"},  # AMD before Zen 4, older Intel
    },
    "keras": {
        "onednn-off": {"TF_ENABLE_ONEDNN_OPTS": "0"},  # Eigen kernels
        "onednn-on": {"TF_ENABLE_ONEDNN_OPTS": "1"},
        "onednn-avx2": {"TF_ENABLE_ONEDNN_OPTS": "1", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    },
    "jax": {
        "xla-native": {},  # the machine's own vector ISA
        "xla-avx2": {"XLA_FLAGS": "--xla_cpu_max_isa=AVX2"},
        "xla-sse4": {"XLA_FLAGS": "--xla_cpu_max_isa=SSE4_2"},
    },
}
SEEDS = (0, 1, 2, 3, 4)
THREADS = (1, 2)


@dataclass(frozen=True)
class Cell:
    """One demo run of every scenario: a framework, a seed, a thread count, a kernel path."""

    framework: str
    seed: int
    threads: int
    path: str

    @property
    def label(self) -> str:
        return f"{self.framework}/{self.path}/seed{self.seed}/{self.threads}t"

    @classmethod
    def parse(cls, label: str) -> Cell:
        """The cell of ``label`` (``torch/aten-avx2/seed1/2t``); ValueError if it is none."""
        try:
            framework, path, seed, threads = label.split("/")
            cell = cls(framework, int(seed.removeprefix("seed")),
                       int(threads.removesuffix("t")), path)
        except ValueError:
            raise ValueError(f"{label!r} is not a cell: framework/path/seedN/Nt") from None
        if path not in PATHS.get(framework, {}):
            raise ValueError(f"{label!r}: no kernel path {path!r} for {framework!r}; one of"
                             f" {sorted((f, p) for f in PATHS for p in PATHS[f])}")
        return cell

    def environment(self) -> dict[str, str]:
        """The process environment of this cell's demo."""
        env = {k: v for k, v in os.environ.items()
               if k not in ("ATEN_CPU_CAPABILITY", "TF_ENABLE_ONEDNN_OPTS", "ONEDNN_MAX_CPU_ISA",
                            "XLA_FLAGS")}
        threads = str(self.threads)
        env.update(OMP_NUM_THREADS=threads, TF_NUM_INTRAOP_THREADS=threads,
                   TF_NUM_INTEROP_THREADS="1", OMP_WAIT_POLICY="PASSIVE",
                   TF_CPP_MIN_LOG_LEVEL="3")
        env.update(PATHS[self.framework][self.path])
        if self.framework == "jax" and self.threads == 1:  # XLA's own thread pool
            env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false"
                                " intra_op_parallelism_threads=1").strip()
        return env


@dataclass
class Outcome:
    """What one cell's runs showed."""

    cell: Cell
    seconds: float
    #: scenario -> why it did not tell its story (empty: it did)
    problems: dict[str, list[str]] = field(default_factory=dict)
    #: scenario -> the kinds of its warning and critical findings
    kinds: dict[str, set[str]] = field(default_factory=dict)
    #: scenario -> the one-line numbers of ``Evidence.summary``
    numbers: dict[str, str] = field(default_factory=dict)
    error: str = ""  # the demo's own failure, if it failed

    @property
    def ok(self) -> bool:
        return not self.error and not any(self.problems.values())


def matrix(frameworks: Iterable[str] = tuple(PATHS), seeds: Iterable[int] = SEEDS,
           threads: Iterable[int] = THREADS) -> list[Cell]:
    """Every cell: framework x kernel path x seed x thread count."""
    seeds, threads = tuple(seeds), tuple(threads)
    return [Cell(f, s, t, p) for f in frameworks for p in PATHS[f]
            for s, t in itertools.product(seeds, threads)]


def _cli() -> str:
    return (shutil.which("tb-introspect", path=os.path.dirname(sys.executable))
            or shutil.which("tb-introspect") or "tb-introspect")


def run_cell(cell: Cell, timeout: float = 1800, scenarios: Iterable[str] = ()) -> Outcome:
    """Train the quick demo of ``cell`` (``scenarios``, default all) into a temporary logdir
    and judge every run."""
    from tb_introspect.demo.evidence import collect, margin_problems, scenario_of, serious_kinds
    from tb_introspect.demo.models import get_scenario
    from tb_introspect.read import read_logdir

    with tempfile.TemporaryDirectory(prefix="demo_cell_") as tmp:
        cmd = [_cli(), "demo", "--framework", cell.framework, "--quick", "--no-progress",
               "--seed", str(cell.seed), "--logdir", tmp]
        cmd += [a for name in scenarios for a in ("--scenario", name)]
        start = time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                           env=cell.environment())
        out = Outcome(cell, time.perf_counter() - start)
        if r.returncode != 0:
            out.error = (r.stderr or r.stdout)[-2000:]
            return out
        for run_name, run in sorted(read_logdir(tmp).items()):
            name = scenario_of(run_name)
            kinds = serious_kinds(run)
            evidence = collect(run)
            out.kinds[name] = kinds
            out.numbers[name] = evidence.summary()
            out.problems[name] = (get_scenario(name).story_problems(kinds)
                                  + margin_problems(name, evidence))
    return out
