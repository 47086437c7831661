"""The plugin and the read side never import TensorFlow (TensorBoard runs them on viewing
servers without TF)."""

from __future__ import annotations

import subprocess
import sys

MODULES = [
    "tb_introspect.plugin",
    "tb_introspect.plugin.introspect_plugin",
    "tb_introspect.read",
    "tb_introspect.read.provider",
    "tb_introspect.plugin.overview",
    "tb_introspect.plugin.http_io",
    "tb_introspect.plugin.assets",
    "tb_introspect.plugin.cache",
]

SCRIPT = """
import sys
for name in {modules!r}:
    __import__(name)
from tb_introspect.plugin import introspect_plugin, overview
from tb_introspect.read.series import RunSeries
from tensorboard.plugins import base_plugin
plugin = introspect_plugin.IntrospectLoader().load(base_plugin.TBContext(data_provider=None))
plugin.get_plugin_apps()
# The overview kernels run without TensorFlow too.
overview.compute_overview(RunSeries(run="empty"))
loaded = sorted(m for m in sys.modules if m == "tensorflow" or m.startswith("tensorflow."))
print("TF:" + ",".join(loaded))
"""


def test_plugin_modules_do_not_import_tensorflow() -> None:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(modules=MODULES)],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout
    assert out.strip().splitlines()[-1] == "TF:", out
