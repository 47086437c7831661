"""The ranks of a distributed run and the host copies of device buffers: each buffer
crosses to the host once per logged point, the ranks' copies gathered on the way.

The tool's collectives run in a process group of its own (gloo, on host copies) with a
timeout (``TIMEOUT_S``, or the environment's ``TB_INTROSPECT_COLLECTIVE_TIMEOUT``): a rank
that never arrives costs the others that long once, then the tool is off on every rank
(``Broken``) and training goes on. A logged point makes one ``exchange``: a small header
(whether this rank's part failed, its payload's length, a value rank 0 shares) gathered
before the payload, so ranks that disagree switch the tool off together instead of handing
gloo buffers of different sizes (which aborts the process).
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable

import numpy as np
import torch

#: Seconds a collective of the tool waits for the other ranks.
TIMEOUT_S = 300.0


class Broken(RuntimeError):
    """A collective of the tool failed or ranks disagree: the tool is off on every rank."""


def host_copy(t: torch.Tensor) -> np.ndarray:
    """A host copy of ``t`` that later in-place resets of ``t`` leave alone (``.cpu()`` of
    a CPU tensor is the tensor itself)."""
    copy = t.cpu()
    return (copy.clone() if copy is t else copy).numpy()


def timeout_s() -> float:
    return float(os.environ.get("TB_INTROSPECT_COLLECTIVE_TIMEOUT", TIMEOUT_S))


class Ranks:
    """This process's rank and the world size (``torch.distributed``'s, else 0 of 1); its
    reads are collectives, so every rank calls them at the same steps."""

    def __init__(self) -> None:
        import torch.distributed as dist

        self.group = None
        self.broken: str | None = None
        #: Called once when a collective fails or the ranks disagree (the tool goes off).
        self.on_broken: Callable[[], None] | None = None
        #: Bytes the last ``exchange`` gathered on each rank (every rank's header and payload).
        self.last_bytes = 0
        #: Bytes every collective of the tool gathered on this rank so far (the exchanges
        #: and the metric ring's drains).
        self.gathered_bytes = 0
        if dist.is_available() and dist.is_initialized():
            self.rank, self.world = dist.get_rank(), dist.get_world_size()
            if self.world > 1:
                self.group = dist.new_group(
                    backend="gloo", timeout=datetime.timedelta(seconds=timeout_s()))
        else:
            self.rank, self.world = 0, 1

    @property
    def writes(self) -> bool:
        """Whether this rank writes the run (rank 0)."""
        return self.rank == 0

    def _all_gather(self, t: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        if self.broken is not None:
            raise Broken(self.broken)
        parts = [torch.empty_like(t) for _ in range(self.world)]
        try:
            dist.all_gather(parts, t, group=self.group)
        except Exception as e:
            first = str(e).splitlines()[0][:200] if str(e) else ""
            raise self._break(f"a collective with the other ranks failed"
                              f" ({type(e).__name__}: {first})") from e
        self.gathered_bytes += t.numel() * t.element_size() * self.world
        return torch.stack(parts)

    def _break(self, why: str) -> Broken:
        """The tool's collectives are over on this rank: ``Broken`` to raise."""
        if self.broken is None:
            self.broken = f"{why}; the tool is off on every rank, training goes on"
            if self.on_broken is not None:
                self.on_broken()
        return Broken(self.broken)

    def exchange(self, payload: np.ndarray | None, shared: float = float("nan")
                 ) -> tuple[np.ndarray, float]:
        """``([ranks, length], rank 0's shared)``: every rank's float64 ``payload`` (None:
        this rank's part failed). Raises ``Broken`` on every rank when a rank failed or the
        lengths differ."""
        if self.world == 1:
            if payload is None:
                raise Broken("the statistics of this point failed")  # not a collective
            return payload[None], shared
        length = -1.0 if payload is None else float(payload.size)
        head = self._all_gather(torch.tensor([length, shared], dtype=torch.float64)).numpy()
        self.last_bytes = 2 * 8 * self.world
        failed = [r for r in range(self.world) if head[r, 0] < 0]
        if failed:
            raise self._break(f"the statistics failed on rank(s) {failed}")
        if len(set(head[:, 0].tolist())) > 1:
            raise self._break("the ranks hold different layer outputs (lengths"
                              f" {head[:, 0].astype(int).tolist()}): a layer first called"
                              " on some ranks only")
        body = self._all_gather(torch.from_numpy(np.ascontiguousarray(payload, np.float64)))
        self.last_bytes += payload.nbytes * self.world
        return body.numpy(), float(head[0, 1])

    def summed(self, buf: torch.Tensor) -> np.ndarray:
        """The sum of every rank's ``buf`` on the host (one collective)."""
        if self.world > 1:
            return self._all_gather(torch.from_numpy(host_copy(buf))).sum(dim=0).numpy()
        return host_copy(buf)
