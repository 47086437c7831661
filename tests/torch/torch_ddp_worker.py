"""One rank of the DistributedDataParallel test (``tests/torch/test_torch_ddp.py``): gloo on CPU,
each rank trains on its half of every global batch."""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from torch import nn

from tb_introspect.torch import Introspector
from tests.torch import torch_support as ts

STEPS, EPOCHS, GLOBAL_BATCH = 6, 2, 16


def plain_cnn() -> nn.Sequential:
    """No BatchNorm: per-rank batch statistics would differ from the global batch's."""
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.Flatten(),
        nn.Linear(8 * 4 * 4, 16), nn.ReLU(), nn.Linear(16, 5),
    )


def rank_main(rank: int, world: int, init: str, log_dir: str) -> None:
    torch.set_num_threads(1)
    # Loopback: the ranks share this machine, whatever its host name resolves to.
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    _train(rank, world, log_dir)
    # Both ranks leave together, and neither runs the interpreter's finalization: gloo's
    # worker threads can still hold work objects whose tensors need the GIL when the
    # interpreter is torn down, and abort the rank ("terminate called without an active
    # exception") long after the run was written. By now the DDP module and its reducer
    # are gone (_train returned) and the Introspector has closed its event file.
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _train(rank: int, world: int, log_dir: str) -> None:
    """Train and log, then drop the DDP module (and its reducer) before gloo goes."""
    torch.manual_seed(0)
    model = plain_cnn()
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    share = GLOBAL_BATCH // world
    data = [(x[rank * share:(rank + 1) * share], y[rank * share:(rank + 1) * share])
            for x, y in ts.batches(STEPS, batch=GLOBAL_BATCH)]
    with Introspector(log_dir, ddp, opt, every="epoch", stats_every=2, overhead=None) as intro:
        ts.train(ddp, opt, data, intro, epochs=EPOCHS)
