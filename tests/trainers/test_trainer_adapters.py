"""The trainer adapters without a training: imports, options, where the HF callback
writes by default."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from types import SimpleNamespace

import pytest

SCRIPT = """
import sys
import tb_introspect, tb_introspect.torch, tb_introspect.diagnose, tb_introspect.read
print("LOADED:" + ",".join(sorted(m for m in sys.modules
                                  if m.split(".")[0] in ("transformers", "lightning",
                                                         "pytorch_lightning", "accelerate"))))
"""


def test_importing_tb_introspect_imports_no_trainer():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                         timeout=300, check=True).stdout.strip().splitlines()[-1]
    assert out == "LOADED:", out


def test_adapters_take_the_introspectors_options_and_check_them_at_once():
    from tb_introspect import lightning, transformers

    for cls in (transformers.IntrospectCallback, lightning.IntrospectCallback):
        cls(every=4, layers="conv.*", stats_every=2, overhead=None)
        with pytest.raises(TypeError, match="unknown option 'evry'"):
            cls(evry=4)
        with pytest.raises(ValueError, match="every"):
            cls(every=0)


def test_hf_default_folder_is_tensorboard_callbacks(tmp_path, monkeypatch):
    from tb_introspect.transformers import tensorboard_dir

    args = SimpleNamespace(output_dir=str(tmp_path))
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", "~/tb")
    assert tensorboard_dir(args) == os.path.expanduser("~/tb")
    monkeypatch.delenv("TENSORBOARD_LOGGING_DIR")
    named = tensorboard_dir(args)
    assert os.path.dirname(named) == os.path.join(str(tmp_path), "runs")
    assert named.endswith("_" + socket.gethostname())
    # The TensorBoardCallback made its folder a second earlier: that one is taken.
    made = tmp_path / "runs" / f"Jan01_00-00-00_{socket.gethostname()}"
    made.mkdir(parents=True)
    (made / "events.out.tfevents.1.host").write_bytes(b"")
    assert tensorboard_dir(args) == str(made)
    # transformers 4's args.logging_dir
    assert tensorboard_dir(SimpleNamespace(output_dir="o", logging_dir="logs/x")) == "logs/x"
