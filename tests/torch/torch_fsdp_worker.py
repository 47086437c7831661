"""One rank of the sharded-training tests (``tests/torch/test_torch_fsdp.py``): gloo on CPU,
each rank trains on its share of every global batch. ``mode`` picks the run:

* ``fsdp``: FSDP2 (``fully_shard`` on each Linear and the root), ``every="epoch"``;
* ``every3``: the same with ``every=3``;
* ``slow``: ``every="epoch"`` with the overhead governor on, rank 1 sleeping in every step;
* ``fault``: the tool's point raises on rank 1 (the tool goes off on every rank, training
  goes on);
* ``absent``: rank 1 stops calling the tool after its third step (it trains on): rank 0
  pays one timeout (``ABSENT_TIMEOUT_S``) at its first point, then the tool is off;
* ``killed``: 3 epochs; rank 0, the writer, kills itself (SIGKILL) in the third;
* ``tp``: tensor parallelism (``ColwiseParallel`` then ``RowwiseParallel``) on the hidden
  layers, every rank on the whole batch.
* ``2d``: 4 ranks on a 2-D mesh (data parallel 2 x tensor parallel 2): the ``tp`` layers,
  then FSDP2 over the data parallel dimension (the column-parallel weights' placement is
  ``_StridedShard``); each data parallel pair trains on its half of every global batch.

Each rank writes what it trained (its losses) to ``<log_dir>/rank<r>.json``.
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings

import torch
import torch.distributed as dist
from torch import nn

from tb_introspect.torch import Introspector
from tb_introspect.torch import parameters as parameters_module

STEPS, EPOCHS, GLOBAL_BATCH, FEATURES, CLASSES = 6, 2, 16, 12, 5
#: Steps per epoch of the ``2d`` run (4 ranks on 2 CPU cores: few steps keep it short).
MESH2D_STEPS = 3
#: The tool's collective timeout in the ``absent`` run (seconds).
ABSENT_TIMEOUT_S = 4


def mlp() -> nn.Sequential:
    """The middle Linear has 2560 weights: more than the shards' sample (2048) holds."""
    return nn.Sequential(nn.Linear(FEATURES, 40), nn.ReLU(), nn.Linear(40, 64), nn.ReLU(),
                         nn.Linear(64, CLASSES))


def batches(steps: int = STEPS, batch: int = GLOBAL_BATCH, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch, FEATURES, generator=g),
             torch.randint(0, CLASSES, (batch,), generator=g)) for _ in range(steps)]


def train(model, opt, data, intro, epochs: int = EPOCHS, sleep: float = 0.0) -> list[float]:
    losses = []
    for _ in range(epochs):
        for x, y in data:
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if sleep:
                time.sleep(sleep)
            intro.step(loss=loss)
            losses.append(float(loss.detach()))
        intro.end_epoch()
    return losses


def rank_main(rank: int, world: int, init: str, log_dir: str, mode: str) -> None:
    torch.set_num_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    os.environ["TB_INTROSPECT_COLLECTIVE_TIMEOUT"] = str(ABSENT_TIMEOUT_S if mode == "absent"
                                                         else 20)
    started = time.time()
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    joined = time.time()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        losses = _train(rank, world, log_dir, mode)
    said = [str(w.message) for w in caught if "tb_introspect" in str(w.message)]
    with open(os.path.join(log_dir, f"rank{rank}.json"), "w") as f:
        # when the rank started (after its imports), joined the group, finished training
        json.dump({"losses": losses, "warnings": said,
                   "times": [started, joined, time.time()]}, f)
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _train(rank: int, world: int, log_dir: str, mode: str) -> list[float]:
    torch.manual_seed(0)
    model = mlp()
    data = batches(MESH2D_STEPS if mode == "2d" else STEPS)
    dp_mesh, dp_rank, dp_size = None, rank, world
    if mode in ("tp", "2d"):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import (
            ColwiseParallel,
            RowwiseParallel,
            parallelize_module,
        )
        if mode == "2d":
            mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
            tp_mesh, dp_mesh = mesh["tp"], mesh["dp"]
            dp_rank, dp_size = dp_mesh.get_local_rank(), dp_mesh.size()
        else:
            tp_mesh = init_device_mesh("cpu", (world,))
        parallelize_module(model, tp_mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    if mode != "tp":
        from torch.distributed.fsdp import fully_shard
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=dp_mesh)
        fully_shard(model, mesh=dp_mesh)
        if mode == "2d":  # what the test reads: the placements the tool was handed
            with open(os.path.join(log_dir, f"placements{rank}.json"), "w") as f:
                json.dump({n: str(p.placements) for n, p in model.named_parameters()}, f)
        share = GLOBAL_BATCH // dp_size
        data = [(x[dp_rank * share:(dp_rank + 1) * share],
                 y[dp_rank * share:(dp_rank + 1) * share]) for x, y in data]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    every = 3 if mode == "every3" else "epoch"
    options = {"overhead": 0.05} if mode == "slow" else {"overhead": None, "stats_every": 2}
    if mode == "fault" and rank == 1:
        def broken(self, seed):
            raise RuntimeError("injected fault")
        parameters_module.ParameterViews.local_payload = broken
    if mode in ("absent", "killed"):
        return _train_unreliable(rank, model, opt, data, Introspector(log_dir, model, opt,
                                                                       every=every, **options),
                                 mode)
    with Introspector(log_dir, model, opt, every=every, **options) as intro:
        return train(model, opt, data, intro,
                     sleep=0.02 if mode == "slow" and rank == 1 else 0.0)


def _record_tool_collectives(intro) -> list[str]:
    """How each collective of the tool on this rank ends, in order: "ok" or the error."""
    ended = []
    all_gather = dist.all_gather

    def recorded(tensors, tensor, group=None, **kwargs):
        if group is None or group is not intro.ranks.group:
            return all_gather(tensors, tensor, group=group, **kwargs)
        try:
            out = all_gather(tensors, tensor, group=group, **kwargs)
        except Exception as e:
            ended.append(f"{type(e).__name__}: {e}")
            raise
        ended.append("ok")
        return out

    dist.all_gather = recorded
    return ended


def _train_unreliable(rank, model, opt, data, intro, mode: str) -> list[float]:
    """``absent``: rank 1 leaves the tool after 3 steps; ``killed``: rank 0 dies in epoch 3.
    Each rank's losses go to ``rank<r>.json``, how its tool's collectives ended to
    ``collectives<r>.json``."""
    losses, step = [], 0
    ended = _record_tool_collectives(intro)
    for epoch in range(3 if mode == "killed" else EPOCHS):
        for x, y in data:
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if mode == "killed" and rank == 0 and epoch == 2 and step % STEPS == 3:
                os.kill(os.getpid(), 9)
            if not (mode == "absent" and rank == 1 and step > 3):
                intro.step(loss=loss)
            losses.append(float(loss.detach()))
        if not (mode == "absent" and rank == 1):
            intro.end_epoch()
    if not (mode == "absent" and rank == 1):
        intro.close()
    with open(os.path.join(intro.log_dir, f"collectives{rank}.json"), "w") as f:
        json.dump(ended, f)
    return losses
