"""The ``loss`` field of a metric's metadata: what the training loss is, as JSON.

Written by the front-ends (``docs/format.md``, "The loss"), read back by the read side as
``RunSeries.loss_info``; the findings use it to tell a classifier's logits from a regression.
"""

from __future__ import annotations

import json
import math

#: What a loss description says (``PluginData.loss``, docs/format.md "The loss").
LOSS_TASKS = ("classification", "regression")


def loss_json(task: str | None, *, from_logits: bool | None = None,
              label_smoothing: float = 0.0, name: str = "") -> str:
    """The description of a training loss as the ``loss`` field holds it.

    ``task``: "classification" (a cross-entropy), "regression" or None (not known);
    ``from_logits``: whether the loss applies the softmax/sigmoid itself (None: not known);
    ``label_smoothing``: the share of each target spread over the other classes.

    Example:
        >>> parse_loss(loss_json("classification", from_logits=True))["from_logits"]
        True
    """
    if task is not None and task not in LOSS_TASKS:
        raise ValueError(f"loss task must be one of {LOSS_TASKS} or None, got {task!r}")
    if from_logits is not None and not isinstance(from_logits, bool):
        raise ValueError(f"from_logits must be True, False or None, got {from_logits!r}")
    ls = float(label_smoothing)
    if not (math.isfinite(ls) and 0 <= ls < 1):
        raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing!r}")
    return json.dumps({"task": task, "from_logits": from_logits, "label_smoothing": ls,
                       "name": str(name)})


def parse_loss(text: str) -> dict | None:
    """A ``loss`` field read back: the dict of ``loss_json``, or None (empty or unreadable)."""
    if not text:
        return None
    try:
        d = json.loads(text)
    except ValueError:
        return None
    if not isinstance(d, dict):
        return None
    ls = d.get("label_smoothing")
    return {"task": d.get("task") if d.get("task") in LOSS_TASKS else None,
            "from_logits": d.get("from_logits") if isinstance(d.get("from_logits"), bool)
            else None,
            "label_smoothing": float(ls) if isinstance(ls, (int, float)) else 0.0,
            "name": str(d.get("name", "")),
            # what the framework knows of the run (torch.loss.describe_run)
            "untrained": [n for n in d["untrained"] if isinstance(n, str)]
            if isinstance(d.get("untrained"), list) else [],
            "output_module": str(d.get("output_module") or "")}
