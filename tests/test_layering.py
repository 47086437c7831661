"""The parts import only what they are allowed to (docs/design.md).

The read side (``tb_introspect.read``) and the findings engine import neither TensorFlow nor
the TensorBoard plugin package, so the plugin, ``tb-introspect diagnose`` and the findings
judged during training all use them and none depends on the plugin that serves them.
"""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import sys
import {module}
loaded = sorted(m for m in sys.modules
                if m.split(".")[0] in ("tensorflow", "keras", "torch", "tb_introspect"))
print("LOADED:" + ",".join(loaded))
"""


def loaded_by(module: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", SCRIPT.format(module=module)],
                         capture_output=True, text=True, timeout=120, check=True).stdout
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
            or m.startswith(("tb_introspect.collect", "tb_introspect.torch"))] == [], loaded
    loaded = loaded_by("tb_introspect.torch")
    assert "tb_introspect.pipeline.pipeline" in loaded
    assert [m for m in loaded if m.split(".")[0] in ("tensorflow", "keras")
            or m.startswith("tb_introspect.collect")] == [], loaded


def test_the_statistics_engine_imports_no_front_end() -> None:
    """``stats/`` is below the Keras front-end: importing it loads nothing of ``collect/``."""
    loaded = loaded_by("tb_introspect.stats")
    assert [m for m in loaded if m.startswith(("tb_introspect.collect", "tb_introspect.torch",
                                               "tb_introspect.pipeline"))] == [], loaded


def test_checking_options_imports_neither_the_findings_engine_nor_the_plugin() -> None:
    loaded = loaded_by("tb_introspect.pipeline.options")
    assert [m for m in loaded if m.split(".")[0] in ("tensorflow", "keras", "torch")
            or m.startswith(("tb_introspect.diagnose", "tb_introspect.plugin",
                             "tb_introspect.pipeline.findings", "tb_introspect.read"))
            ] == [], loaded


#: The parts of docs/design.md's dependency block: the first name of a module's path after
#: ``tb_introspect`` that names a part, or the part it belongs to.
PARTS = {"keras": "collect", "summary": "collect", "transformers": "trainers",
         "lightning": "trainers", "metadata": "format", "proto": "format",
         "summary_pb": "format", "schema": "format", "schema_js": "format",
         "rundata": "read"}


def _part(module: str) -> str | None:
    names = module.split(".")
    if names[0] != "tb_introspect" or len(names) == 1:
        return None
    return PARTS.get(names[1], names[1])


def test_the_design_documents_every_dependency_between_parts() -> None:
    import ast
    import re
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    block = re.search(r"Dependencies point one way.*?```text\n(.*?)```",
                      (repo / "docs" / "design.md").read_text(encoding="utf-8"), re.S).group(1)
    documented = {(line.split("->")[0].strip(), target) for line in block.splitlines()
                  for target in line.split("->")[1].split()}
    imported = set()
    for path in (repo / "tb_introspect").rglob("*.py"):
        module = ".".join(path.relative_to(repo).with_suffix("").parts)
        source = _part(module.removesuffix(".__init__"))
        if source is None:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module:
                targets = [_part(node.module)]
                if node.module == "tb_introspect":
                    targets = [_part(f"tb_introspect.{n.name}") for n in node.names]
            elif isinstance(node, ast.Import):
                targets = [_part(n.name) for n in node.names]
            else:
                continue
            imported |= {(source, t) for t in targets if t not in (None, source, "__version__")}
    assert sorted(imported - documented) == [], "imports the design does not list"
    assert sorted(documented - imported) == [], "the design lists imports that are gone"
