"""Training overhead of ``tb_introspect.torch.Introspector`` on a model sharded by FSDP2,
2 CPU ranks (gloo, spawned processes): wall and CPU time, and the bytes each point moves.

The GPT-style model of ``torch_overhead.py`` (4 pre-LN causal blocks, width 128, vocabulary
1000, sequence 64), ``fully_shard`` on each block and on the root, a global batch of 32 (16
per rank), SGD with momentum. Each rank holds two copies side by side: a plain loop and the
same loop with ``Introspector(log_dir, model, opt)`` at its defaults (``every="epoch"``, the
overhead governor, all four views). After a warm-up epoch each, rounds of one epoch per
variant are interleaved (the order alternates every round); a round's CPU time is the sum
over both ranks' processes, its wall time rank 0's; each figure is the median over rounds
of the per-round ratio to the plain loop. The bytes are measured: what the tool's
collectives gathered on a rank (``Ranks.gathered_bytes``: every rank's header and payload
of the point's exchange, and the metric ring's drain), per logged point.

    python benchmarks/sharded_overhead.py            # the table of docs/benchmarks.md
    python benchmarks/sharded_overhead.py --quick    # a fast smoke run
"""

from __future__ import annotations

import argparse
import os
import queue as queues
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_overhead import GPT, tokens, train_step  # noqa: E402

from tb_introspect.torch import Introspector  # noqa: E402

WORLD = 2
TARGET_CPU = 1.10


class Variant:
    """One FSDP2-sharded copy of the model with its optimizer (and the tool, or not)."""

    def __init__(self, name: str, log_dir: str | None):
        from torch.distributed.fsdp import fully_shard

        torch.manual_seed(0)
        self.name = name
        self.model = GPT()
        for block in self.model.blocks:
            fully_shard(block)
        fully_shard(self.model)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        self.intro = Introspector(log_dir, self.model, self.opt) if log_dir else None
        self.points = 0
        self.wall: list[float] = []
        self.cpu: list[float] = []

    def epoch(self, data: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[float, float]:
        dist.barrier()
        wall, cpu = time.perf_counter(), time.process_time()
        self.model.train()
        for x, y in data:
            loss = train_step(self.model, self.opt, x, y)
            if self.intro is not None:
                self.intro.step(loss=loss)
        if self.intro is not None:
            self.intro.end_epoch()
            self.points += 1
        cpu = time.process_time() - cpu
        dist.barrier()
        return time.perf_counter() - wall, cpu


def rank_main(rank: int, init: str, root: str, args: argparse.Namespace, queue) -> None:
    torch.set_num_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=args.ranks)
    g = torch.Generator().manual_seed(0)
    share = args.batch // args.ranks
    data = [tuple(t[rank * share:(rank + 1) * share] for t in tokens(args.batch, g))
            for _ in range(args.steps)]
    variants = [Variant("plain", None), Variant("Introspector()", os.path.join(root, "run"))]
    for v in variants:  # warm-up: first-call allocations, hooks, the tool's first point
        v.epoch(data[: max(2, args.steps // 8)])
    for r in range(args.rounds):
        for v in (variants if r % 2 == 0 else variants[::-1]):
            w, c = v.epoch(data)
            v.wall.append(w)
            v.cpu.append(c)
        if rank == 0:
            print(f"  round {r + 1}/{args.rounds}: "
                  + ", ".join(f"{v.name} {v.wall[-1]:.1f}s" for v in variants),
                  file=sys.stderr, flush=True)
    intro = variants[1].intro
    ranks = intro.ranks
    result = {"wall": [v.wall for v in variants], "cpu": [v.cpu for v in variants],
              "points": variants[1].points, "gathered": ranks.gathered_bytes,
              "exchange": ranks.last_bytes, "broken": ranks.broken,
              "params": sum(p.numel() for p in GPT().parameters())}
    intro.close()
    queue.put((rank, result))
    dist.barrier()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=32, help="steps per epoch")
    p.add_argument("--batch", type=int, default=32, help="global batch (split over 2 ranks)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (median over them)")
    p.add_argument("--quick", action="store_true", help="smoke run: 4 steps, 1 round")
    p.add_argument("--ranks", type=int, default=WORLD,
                   help="ranks; 1 runs in this process (a smoke run of the benchmark's own"
                        " code: no exchange between ranks)")
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.rounds = 4, 1
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as root:
        init = f"file://{root}/store"
        if args.ranks == 1:
            queue = queues.SimpleQueue()
            rank_main(0, init, root, args, queue)
            results = dict([queue.get()])
        else:
            queue = ctx.Queue()
            procs = [ctx.Process(target=rank_main, args=(r, init, root, args, queue))
                     for r in range(args.ranks)]
            for proc in procs:
                proc.start()
            results = dict(queue.get(timeout=3600) for _ in procs)
            for proc in procs:
                proc.join()
            if any(proc.exitcode for proc in procs):
                print(f"a rank exited {[proc.exitcode for proc in procs]}", file=sys.stderr)
                return 1
    r0 = results[0]
    if any(r["broken"] for r in results.values()):
        print(f"the tool switched itself off: {r0['broken']}", file=sys.stderr)
        return 1
    cpu = [[sum(c) for c in zip(*(results[r]["cpu"][i] for r in results), strict=True)]
           for i in range(2)]
    wall_ratio = statistics.median(a / b for a, b in zip(r0["wall"][1], r0["wall"][0],
                                                         strict=True))
    cpu_ratio = statistics.median(a / b for a, b in zip(cpu[1], cpu[0], strict=True))
    ms = statistics.median((a - b) * 1000 / args.steps / args.ranks
                           for a, b in zip(cpu[1], cpu[0], strict=True))
    plain_ms = statistics.median(r0["wall"][0]) * 1000 / args.steps
    per_point = r0["gathered"] / max(r0["points"], 1)
    print(f"\nGPT-style ({r0['params']:,} parameters), FSDP2 on {args.ranks} CPU ranks (gloo, 1"
          f" thread each), {args.steps} steps per epoch, global batch {args.batch}, median of"
          f" {args.rounds} interleaved rounds, torch {torch.__version__}, load average"
          f" {os.getloadavg()[0]:.1f}\n")
    print("| model | configuration | wall | CPU | added CPU ms/step per rank | bytes per point"
          " (gathered on each rank) | target |")
    print("|---|---|---:|---:|---:|---:|---:|")
    print(f"| GPT-style, FSDP2 × {args.ranks} | `Introspector()` (every='epoch') |"
          f" {wall_ratio:.2f}× | {cpu_ratio:.2f}× | {ms:.0f} | {per_point:,.0f} |"
          f" ≤ {TARGET_CPU:.2f}× CPU |")
    print(f"\nplain loop: {plain_ms:.0f} ms/step; the point's exchange: {r0['exchange']:,}"
          f" bytes ({r0['exchange'] // args.ranks:,} from each rank); {r0['points']} points")
    return 0


if __name__ == "__main__":
    sys.exit(main())
