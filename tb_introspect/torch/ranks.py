"""The ranks of a distributed run and the host copies of device buffers: each buffer
crosses to the host once per logged point, the ranks' copies gathered on the way."""

from __future__ import annotations

import numpy as np
import torch


def host(t: torch.Tensor) -> np.ndarray:
    """A host copy of ``t`` that later in-place resets of ``t`` leave alone (``.cpu()`` of
    a CPU tensor is the tensor itself)."""
    copy = t.cpu()
    return (copy.clone() if copy is t else copy).numpy()


class Ranks:
    """This process's rank and the world size (``torch.distributed``'s, else 0 of 1); its
    reads are collectives, so every rank calls them at the same steps."""

    def __init__(self) -> None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            self.rank, self.world = dist.get_rank(), dist.get_world_size()
        else:
            self.rank, self.world = 0, 1

    @property
    def writes(self) -> bool:
        """Whether this rank writes the run (rank 0)."""
        return self.rank == 0

    def gathered(self, buf: torch.Tensor) -> np.ndarray:
        """``[ranks, length]``: every rank's copy of ``buf`` on the host (one copy)."""
        if self.world > 1:
            import torch.distributed as dist

            parts = [torch.empty_like(buf) for _ in range(self.world)]
            dist.all_gather(parts, buf.contiguous())
            return host(torch.stack(parts))
        return host(buf)[None]

    def summed(self, buf: torch.Tensor) -> np.ndarray:
        """The sum of every rank's ``buf`` on the host (one copy)."""
        if self.world > 1:
            import torch.distributed as dist

            buf = buf.clone()
            dist.all_reduce(buf)
        return host(buf)
