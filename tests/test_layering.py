"""The read side's layers import only what they are allowed to (docs/design.md).

The run data model and the findings engine are numpy only: neither TensorFlow nor the
TensorBoard plugin package, so the overview and ``tb-introspect diagnose`` can both use
them and the findings engine does not depend on the plugin that calls it.
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


def test_run_data_model_and_findings_import_neither_tensorflow_nor_the_plugin() -> None:
    for module in ("tb_introspect.rundata", "tb_introspect.json_values",
                   "tb_introspect.diagnose"):
        loaded = loaded_by(module)
        assert module in loaded and outside(loaded) == [], (module, loaded)


def test_the_overview_imports_the_findings_engine_itself() -> None:
    # No lazy import "when the module exists": a broken engine fails at import, in tests.
    loaded = loaded_by("tb_introspect.plugin.overview")
    assert "tb_introspect.diagnose" in loaded and "tb_introspect.rundata" in loaded
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
                             "tb_introspect.pipeline.findings", "tb_introspect.rundata"))
            ] == [], loaded
