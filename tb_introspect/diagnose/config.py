"""Rules on what the framework knows of the run's configuration, recorded by the front-end
with the loss (``RunSeries.loss_info``, docs/format.md "The loss"), never guessed:

* ``untrained_parameters``: parameters that get gradients (PyTorch ``requires_grad``) and
  that no optimizer parameter group holds, so nothing updates them and nothing zeroes their
  gradients. A backbone frozen on purpose (``requires_grad_(False)``, Keras
  ``trainable=False``) gets no gradient and is not listed.
"""

from __future__ import annotations

from tb_introspect.diagnose.core import Finding, RunView, rule


def untrained(rv: RunView) -> list[str]:
    """The recorded parameters in no optimizer group (``<layer>/<parameter>``)."""
    return list((rv.run.loss_info or {}).get("untrained") or [])


def untrained_layers(rv: RunView) -> list[str]:
    """The layers of ``untrained``'s parameters, in the order recorded (model order)."""
    return list(dict.fromkeys(n.rpartition("/")[0] for n in untrained(rv)))


@rule("untrained_parameters", needs=("loss",), needs_history=False)
def untrained_parameters(rv: RunView) -> list[Finding]:
    """Parameters with ``requires_grad`` in no optimizer parameter group, as recorded when
    training started (or when the optimizer's groups last changed before the loss was
    first written)."""
    names = untrained(rv)
    if not names:
        return []
    layers = untrained_layers(rv)
    name = rv.loss_name()
    loss = rv.run.metrics.get(name) if name else None
    first_step = int(loss.steps[0]) if loss is not None and len(loss) else None
    tags = [s.info.tag for s in rv.run.tensors.get("gradient", [])
            if s.info.layer in set(layers)]
    shown = ", ".join(f"'{la}'" for la in layers[:4]) + (
        f" and {len(layers) - 4} more" if len(layers) > 4 else "")
    return [Finding(
        kind="untrained_parameters",
        severity="warning",
        title=(f"Parameters trained by nothing: {len(names)} parameter tensor(s) of"
               f" {len(layers)} layer(s) ({shown}) get gradients but are in no optimizer"
               " parameter group"),
        first_step=first_step, first_epoch=0 if first_step is not None else None,
        layers=layers, tags=tags,
        view="gradient" if tags else None,
        evidence={
            "parameters": len(names),
            "layers": len(layers),
            "names": ", ".join(names[:20]) + (" ..." if len(names) > 20 else ""),
            "source": "optimizer parameter groups",
        },
        explanation=(
            "These parameters have requires_grad set, so backward() computes their"
            " gradients, but the optimizer was not given them: optimizer.step() never"
            " updates them and optimizer.zero_grad() never clears their gradients, which"
            " keep adding up. The layers stay at their initial values (usually an optimizer"
            " built over part of the model, e.g. model.head.parameters(), or a layer added"
            " after the optimizer was made)."
        ),
        suggestion=(
            "Build the optimizer over every parameter that should learn"
            " (model.parameters(), or add_param_group for the missing ones); if the layers"
            " are meant to stay fixed, freeze them with requires_grad_(False) so no gradient"
            " is computed for them."
        ),
        jump=({"tab": "layers", "view": "gradient", "tag": tags[0], "chart": "rms"} if tags
              else {"tab": "overview"}),
    )]
