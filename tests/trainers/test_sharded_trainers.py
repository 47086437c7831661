"""Sharded training driven by a trainer, on 2 CPU processes (gloo): Lightning's
``ModelParallelStrategy`` with FSDP2. (Lightning's ``FSDPStrategy`` and the Hugging Face
``Trainer``'s FSDP do not shard on CPU: docs/distributed.md.)"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from tests.torch import torch_support as ts
from tests.trainers import lightning_sharded_worker as worker

WORKER = Path(worker.__file__)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_lightning_model_parallel_strategy_writes_the_whole_model(tmp_path):
    """Both ranks start at once, as ``torchrun`` starts them (``LOCAL_RANK`` set: Lightning
    joins them instead of launching the second after the first has imported everything,
    which doubled the time spent importing Lightning)."""
    log_dir = tmp_path / "run"
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]),
           "GLOO_SOCKET_IFNAME": "lo", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(_free_port()), "WORLD_SIZE": "2", "NODE_RANK": "0"}
    # Each rank's stderr goes to a file: a pipe read one rank after the other can fill up
    # while the reader waits on the other rank, which then waits on this one in a collective.
    logs = [tmp_path / f"rank{r}.err" for r in range(2)]
    procs = [subprocess.Popen([sys.executable, str(WORKER), str(log_dir)], cwd=tmp_path,
                              env={**env, "LOCAL_RANK": str(r), "RANK": str(r)},
                              stdout=subprocess.DEVNULL, stderr=logs[r].open("w"))
             for r in range(2)]
    try:
        for p in procs:
            p.wait(timeout=180)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    errs = [log.read_text() for log in logs]
    for p, err in zip(procs, errs, strict=True):
        assert p.returncode == 0, err[-4000:]
        assert "tb_introspect:" not in err, err[-4000:]
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
