"""The numbers the PyTorch transformer probes take (``probes.Probes`` hooks them): the
largest |pre-softmax logit| of an attention call from its own q and k (``logit_peak``, and
``mha_logit_peak`` from ``multi_head_attention_forward``'s arguments), at the query rows
``query_rows`` picks, and a layer output's median |a| on the device (``abs_median``). Their
definitions are the contract's (``pipeline/probe_window.py``: the query rows, the batch
elements, the masks, the median)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from tb_introspect.pipeline.probe_window import LOGIT_BUDGET, MASKED, QUERY_ROWS, batch_elements


def query_rows(length: int, rows: int = QUERY_ROWS,
               device: torch.device | str = "cpu") -> torch.Tensor:
    """``probe_window.query_rows``, made on ``device`` (no copy to wait for): all of the
    ``length`` query rows up to ``rows``, else ``rows`` evenly spread."""
    n = min(length, rows)
    return torch.arange(n, device=device) * (length - 1) // max(n - 1, 1)


def abs_median(sample: torch.Tensor) -> torch.Tensor:
    """``probe_window.abs_median`` on the device, a scalar: the lower median of the finite
    ``|sample|`` by selection (``nanmedian``, not a sort), ±inf left out as NaN is; NaN
    where none is finite."""
    a = sample.abs()
    return torch.where(a == math.inf, math.nan, a).nanmedian()


def logit_peak(q: torch.Tensor, k: torch.Tensor, masks: Sequence[torch.Tensor] = (), *,
               is_causal: bool = False, scale: float | None = None,
               rows: int = QUERY_ROWS, budget: int = LOGIT_BUDGET) -> torch.Tensor:
    """The largest |pre-softmax logit| ``scale * q·k (+ mask)`` of an attention call, a device
    scalar. ``q``: ``(..., L, E)``, ``k``: ``(..., S, E)`` (leading dims broadcast);
    ``masks``: as ``scaled_dot_product_attention`` takes them, broadcastable to
    ``(..., L, S)``: a bool mask keeps its True positions, a float one is added and excludes
    positions at or below ``MASKED``; ``is_causal``: the top-left causal mask; ``scale``:
    default ``1 / sqrt(E)``. Over ``query_rows(L, rows)`` and the first
    ``probe_window.batch_elements`` elements of the first batch dim (``budget`` logits)."""
    length, width = q.shape[-2:]
    keys = k.shape[-2]
    scale = 1.0 / math.sqrt(width) if scale is None else float(scale)
    r = query_rows(length, rows, q.device)
    lead = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    b = batch_elements(math.prod(lead[1:]) * len(r) * keys, budget)
    rank = len(lead) + 2

    def first(t: torch.Tensor) -> torch.Tensor:  # the kept batch elements of a full-rank t
        return t[:b] if t.dim() == rank and rank > 2 and t.shape[0] > b else t

    qs = first(q) if len(r) == length else first(q).index_select(-2, r)
    # the scale on the few query rows, then in-place passes over the logits, no copies
    logits = torch.matmul(qs.float() * scale, first(k).float().transpose(-1, -2))
    keep = None
    if is_causal:
        keep = r[:, None] >= torch.arange(keys, device=q.device)[None, :]
    for m in masks:
        m = first(m)
        if m.shape[-2] == length and length > 1:
            m = m.index_select(-2, r)
        if m.dtype == torch.bool:
            keep = m if keep is None else keep & m
        else:
            m = m.float()
            usable = m > MASKED
            logits.add_(torch.where(usable, m, 0.0))
            keep = usable if keep is None else keep & usable
    if not logits.numel():
        return torch.zeros((), device=q.device)
    if keep is not None:
        logits.masked_fill_(~keep, 0.0)
    lo, hi = torch.aminmax(logits)
    return torch.maximum(hi, -lo)


def mha_logit_peak(*, query: torch.Tensor, key: torch.Tensor, num_heads: int,
                   in_proj_weight: torch.Tensor | None, in_proj_bias: torch.Tensor | None,
                   bias_k: torch.Tensor | None = None, key_padding_mask: Any = None,
                   attn_mask: Any = None, use_separate_proj_weight: bool = False,
                   q_proj_weight: Any = None, k_proj_weight: Any = None, static_k: Any = None,
                   is_causal: bool = False, **_: Any) -> torch.Tensor:
    """``logit_peak`` of one ``F.multi_head_attention_forward`` call (``nn.MultiheadAttention``),
    from its arguments: q and k by its in-projection, its masks (a bool mask's True
    positions are left out, a float one is added)."""
    batched = query.dim() == 3
    query = query.detach() if batched else query.detach().unsqueeze(1)
    key = key.detach() if batched else key.detach().unsqueeze(1)
    length, batch, width = query.shape
    head = width // num_heads
    if use_separate_proj_weight:
        w_q, w_k = q_proj_weight, k_proj_weight
    else:
        w_q, w_k, _ = in_proj_weight.chunk(3)
    b_q = b_k = None
    if in_proj_bias is not None:
        b_q, b_k, _ = in_proj_bias.chunk(3)
    q = F.linear(query, w_q.detach(), None if b_q is None else b_q.detach())
    q = q.reshape(length, batch, num_heads, head).permute(1, 2, 0, 3)
    if static_k is not None:
        k = static_k.detach().reshape(batch, num_heads, -1, head)
    else:
        k = F.linear(key, w_k.detach(), None if b_k is None else b_k.detach())
        if bias_k is not None:
            k = torch.cat([k, bias_k.detach().expand(1, batch, width)])
        k = k.reshape(k.shape[0], batch, num_heads, head).permute(1, 2, 0, 3)
    keys = k.shape[-2]
    masks = []
    if attn_mask is not None:
        m = attn_mask.detach()
        m = m.reshape(batch, num_heads, length, -1) if m.dim() == 3 else m
        masks.append(m)
    if key_padding_mask is not None:
        m = key_padding_mask.detach()
        m = m if batched else m.unsqueeze(0)
        masks.append(m.reshape(batch, 1, 1, -1))
    out = []
    for m in masks:
        if m.shape[-1] < keys:  # bias_k's key: never masked
            m = F.pad(m, (0, keys - m.shape[-1]))
        out.append(~m if m.dtype == torch.bool else m)
    return logit_peak(q, k, out, is_causal=is_causal and attn_mask is None)
