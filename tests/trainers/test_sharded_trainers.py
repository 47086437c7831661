"""Sharded training driven by a trainer, on 2 CPU processes (gloo): Lightning's
``ModelParallelStrategy`` with FSDP2. (Lightning's ``FSDPStrategy`` and the Hugging Face
``Trainer``'s FSDP do not shard on CPU: docs/distributed.md.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.torch import torch_support as ts
from tests.trainers import lightning_sharded_worker as worker

WORKER = Path(worker.__file__)


def test_lightning_model_parallel_strategy_writes_the_whole_model(tmp_path):
    log_dir = tmp_path / "run"
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]),
           "GLOO_SOCKET_IFNAME": "lo"}
    r = subprocess.run([sys.executable, str(WORKER), str(log_dir)], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-4000:]
    assert "tb_introspect:" not in r.stderr, r.stderr[-4000:]
    run = ts.read_run(str(log_dir))
    whole = {name: p.numel() for name, p in worker.mlp().named_parameters()}
    for view in ("variable", "gradient"):
        got = ts.by_name(run, view)
        assert len(got) == len(whole), (view, sorted(got))
        for name, n in whole.items():
            layer, kind = name.rsplit(".", 1)
            series = got[f"net.{layer}/{kind}"]
            assert list(series.steps) == list(range(1, worker.STEPS + 1)), (view, name)
            counts = series.field("count")
            assert all(int(c) == n for c in counts), (view, name, counts, n)
    assert ts.by_name(run, "output")
