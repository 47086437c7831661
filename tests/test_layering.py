"""The parts import only what they are allowed to (docs/design.md).

The read side (``tb_introspect.read``) and the findings engine import neither TensorFlow nor
the TensorBoard plugin package, so the plugin, ``tb-introspect diagnose`` and the findings
judged during training all use them and none depends on the plugin that serves them.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = """
import sys
import {module}
loaded = sorted(m for m in sys.modules
                if m.split(".")[0] in ("tensorflow", "keras", "torch", "tb_introspect"))
print("LOADED:" + ",".join(loaded))
"""


def loaded_by(module: str, **env: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", SCRIPT.format(module=module)],
                         capture_output=True, text=True, timeout=120, check=True,
                         env={**os.environ, **env}).stdout
    line = out.strip().splitlines()[-1]
    assert line.startswith("LOADED:"), out
    return [m for m in line[len("LOADED:"):].split(",") if m]


def outside(loaded: list[str]) -> list[str]:
    """TensorFlow, Keras and plugin modules among ``loaded``."""
    return [m for m in loaded if m.split(".")[0] in ("tensorflow", "keras")
            or m.startswith("tb_introspect.plugin")]


def test_the_read_side_and_findings_import_neither_tensorflow_nor_the_plugin() -> None:
    for module in ("tb_introspect.read", "tb_introspect.read.series",
                   "tb_introspect.read.json_values", "tb_introspect.diagnose"):
        loaded = loaded_by(module)
        assert module in loaded and outside(loaded) == [], (module, loaded)


def test_the_overview_imports_the_findings_engine_itself() -> None:
    # No lazy import "when the module exists": a broken engine fails at import, in tests.
    loaded = loaded_by("tb_introspect.plugin.overview")
    assert "tb_introspect.diagnose" in loaded and "tb_introspect.read.series" in loaded
    assert [m for m in outside(loaded) if not m.startswith("tb_introspect.plugin")] == []


def test_the_pipeline_is_framework_neutral_and_pytorch_does_not_import_keras() -> None:
    """Every front-end feeds ``pipeline/``: it imports no framework, and the PyTorch side
    imports the pipeline, never the Keras package."""
    loaded = loaded_by("tb_introspect.pipeline.pipeline")
    assert [m for m in loaded if m.split(".")[0] in ("tensorflow", "keras", "torch")
            or m.startswith(("tb_introspect.keras", "tb_introspect.torch"))] == [], loaded
    loaded = loaded_by("tb_introspect.torch")
    assert "tb_introspect.pipeline.pipeline" in loaded
    assert [m for m in loaded if m.split(".")[0] in ("tensorflow", "keras")
            or m.startswith("tb_introspect.keras")] == [], loaded


def test_jax_imports_no_other_framework() -> None:
    """The JAX front-end needs neither TensorFlow nor PyTorch nor the other front-ends."""
    loaded = loaded_by("tb_introspect.jax")
    assert "tb_introspect.pipeline.pipeline" in loaded
    assert [m for m in loaded if m.split(".")[0] in ("tensorflow", "keras", "torch")
            or m.startswith(("tb_introspect.keras", "tb_introspect.torch"))] == [], loaded


@pytest.mark.parametrize("backend,engine,other", [("torch", "torch", "jax"),
                                                  ("jax", "jax", "torch")])
def test_keras_on_pytorch_or_jax_imports_no_tensorflow(backend, engine, other) -> None:
    """On Keras's PyTorch or JAX backend the callback drives that framework's engine: a user
    without TensorFlow installed can use it."""
    loaded = loaded_by("tb_introspect.keras", KERAS_BACKEND=backend)
    assert f"tb_introspect.keras.{backend}_backend" in loaded
    assert f"tb_introspect.{engine}" in loaded
    assert [m for m in loaded if m.split(".")[0] in ("tensorflow", other)
            or m in ("tb_introspect.keras.callback", "tb_introspect.stats")] == [], loaded


def test_the_statistics_engine_imports_no_front_end() -> None:
    """``stats/`` is below the Keras front-end: importing it loads nothing of ``keras/``."""
    loaded = loaded_by("tb_introspect.stats")
    assert [m for m in loaded if m.startswith(("tb_introspect.keras", "tb_introspect.torch",
                                               "tb_introspect.pipeline"))] == [], loaded


def test_checking_options_imports_neither_the_findings_engine_nor_the_plugin() -> None:
    loaded = loaded_by("tb_introspect.pipeline.options")
    assert [m for m in loaded if m.split(".")[0] in ("tensorflow", "keras", "torch")
            or m.startswith(("tb_introspect.diagnose", "tb_introspect.plugin",
                             "tb_introspect.pipeline.findings", "tb_introspect.read"))
            ] == [], loaded


#: The parts of docs/design.md's dependency block: the first name of a module's path after
#: ``tb_introspect`` that names a part, or the part it belongs to.
PARTS = {"summary": "keras", "transformers": "trainers",
         "lightning": "trainers", "metadata": "format", "slots": "format",
         "loss_field": "format", "proto": "format",
         "summary_pb": "format", "schema": "format", "schema_js": "format",
         "rundata": "read"}


def _part(module: str) -> str | None:
    names = module.split(".")
    if names[0] != "tb_introspect" or len(names) == 1:
        return None
    return PARTS.get(names[1], names[1])


REPO = Path(__file__).resolve().parents[1]


def design_block() -> dict[str, set[str]]:
    """docs/design.md's dependency block: each part and the parts it may import (a part that
    imports none, named only on the right, with none)."""
    text = (REPO / "docs" / "design.md").read_text(encoding="utf-8")
    block = re.search(r"Dependencies point one way.*?```text\n(.*?)```", text, re.S).group(1)
    parts = {line.split("->")[0].strip(): set(line.split("->")[1].split())
             for line in block.splitlines() if "->" in line}
    return {p: parts.get(p, set()) for p in sorted({*parts, *set().union(*parts.values())})}


def module_imports() -> dict[str, set[str]]:
    """Every module of ``tb_introspect`` and the package's modules it imports (anywhere in
    it, a function's import too): ``from p import m`` names the module ``p.m`` where there is
    one, else ``p``."""
    paths = {".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__"): p
             for p in (REPO / "tb_introspect").rglob("*.py")}

    def known(name: str) -> str | None:
        while name and name not in paths:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, set[str]] = {}
    for module, path in paths.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                targets |= {known(f"{node.module}.{n.name}") for n in node.names}
            elif isinstance(node, ast.Import):
                targets |= {known(n.name) for n in node.names}
        edges[module] = targets - {None, module}
    return edges


def cycle(edges: dict[str, set[str]]) -> list[str]:
    """One cycle of the graph ``edges`` (its nodes in order, the first again at the end), or
    [] when the graph has a topological order."""
    state: dict[str, int] = {}  # 1: on the path being followed, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return []

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return []


def test_the_design_documents_every_dependency_between_parts() -> None:
    documented = {(source, t) for source, targets in design_block().items() for t in targets}
    imported = {(source, t) for module, targets in module_imports().items()
                if (source := _part(module)) is not None
                for t in map(_part, targets) if t not in (None, source)}
    assert sorted(imported - documented) == [], "imports the design does not list"
    assert sorted(documented - imported) == [], "the design lists imports that are gone"


def test_the_parts_have_an_order_no_import_goes_back_up() -> None:
    """The design's block has a topological order: no two parts import each other, however
    indirectly (with the test above, neither do the modules of different parts)."""
    block = design_block()
    assert cycle(block) == [], "parts that import each other"
    order: list[str] = []  # lowest first: a part comes after every part it imports
    while len(order) < len(block):
        order += sorted(p for p, targets in block.items()
                        if p not in order and targets <= set(order))
    assert order.index("format") < order.index("stats_np") < order.index("pipeline")
    assert order.index("read") < order.index("diagnose") < order.index("plugin")


def test_no_module_imports_itself_through_others() -> None:
    """Within a part too: no import loop between modules (a function's import counts), so
    each module can be read, tested and moved after the ones it imports."""
    assert cycle(module_imports()) == []
