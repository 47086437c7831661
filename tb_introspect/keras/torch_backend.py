"""``Introspect`` on Keras's PyTorch backend: the PyTorch engine over the Keras model.

On this backend a Keras layer is a ``torch.nn.Module`` whose forward hooks fire when it is
called, its variables are ``torch.nn.Parameter``s (held by the model in one
``ParameterDict``, so torch's module tree does not list the layers), and ``fit``'s train step
runs ``loss.backward()`` before the Keras optimizer applies the gradients. So the callback
hands ``tb_introspect.torch.Introspector`` the Keras layers to hook and the variables to
read (their gradients as backward left them), named as on TensorFlow: a variable by its
path, an output by its layer; and for the transformer probes its attention layers and its
head. The per-step loss and metrics are each ``Mean`` metric's change in total and count, as
on TensorFlow.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import keras
import torch

from tb_introspect import slots
from tb_introspect.keras.engine_callback import EngineCallback
from tb_introspect.keras.model_parts import (
    is_rectifier,
    layers_to_capture,
    mean_metrics,
    variable_owners,
)
from tb_introspect.pipeline.failures import warn
from tb_introspect.pipeline.options import OptionArgs
from tb_introspect.pipeline.plan import Plan, sanitize
from tb_introspect.torch import FindingStop, Introspector
from tb_introspect.torch.modules import OutputSpec, ParamSpec, Parts

if TYPE_CHECKING:
    from typing_extensions import Unpack


def keras_parts(model: keras.Model, plan: Plan) -> Parts:
    """The trainable variables and the layer outputs of ``model`` that ``plan`` keeps, in
    layer order (``model_parts.layers_to_capture``: the TensorFlow callback's names); for
    the probes its attention layers (``MultiHeadAttention`` and the like, whose
    ``scaled_dot_product_attention`` calls they read) and its last ``Dense`` layer if it
    has no activation, kept as the head once a forward pass shows its output to be the
    model's."""
    layers = layers_to_capture(model)
    owner = variable_owners(layers)
    depth = {e.name: d for d, e in enumerate(layers)}
    params, offset = [], 0
    for v in model.trainable_variables:
        layer = owner.get(id(v), model.name)
        if not plan.chosen(layer):
            continue
        p = v.value
        params.append(ParamSpec(
            view="variable", name=sanitize(v.path), layer=layer,
            depth=depth.get(layer, len(depth)), shape=tuple(p.shape),
            dtype=str(p.dtype).replace("torch.", ""), param=p, offset=offset))
        offset += p.numel()
    outputs = [OutputSpec(
        view="output", name=sanitize(e.name), layer=e.name, depth=depth[e.name],
        module=e.layer,
        channels_first=getattr(e.layer, "data_format", None) == "channels_first",
        exact=is_rectifier(e.layer) or plan.named_rectifier(e.name))
        for e in layers if plan.chosen(e.name)]
    attention = [(e.name, e.layer) for e in layers
                 if "attention" in type(e.layer).__name__.lower()]
    # Logits: a Dense layer with an activation (a softmax head) gives the probes none.
    dense = [e for e in layers if isinstance(e.layer, keras.layers.Dense)]
    dense = [e for e in dense[-1:] if getattr(e.layer.activation, "__name__", "") == "linear"]
    head = (dense[-1].name, dense[-1].layer, False) if dense else None
    return Parts(params, outputs, attention, head)


class Introspect(EngineCallback):
    """The Keras callback on the PyTorch backend (``KERAS_BACKEND=torch``): the same views,
    options and findings as on TensorFlow, from an unmodified ``fit``.

    Example:
        >>> from tb_introspect.keras import Introspect
        >>> model.fit(x, y, epochs=10, callbacks=[Introspect("logs/run1")])  # doctest: +SKIP
    """

    def __init__(self, log_dir: str | os.PathLike, views: Sequence[str] = slots.VIEWS,
                 every: str | int = "epoch", **options: Unpack[OptionArgs]):
        super().__init__(log_dir, views, every, **options)
        self.introspector: Introspector | None = None
        self._metrics: list[Any] = []
        self._before: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._said_executions = False

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        if self._stopped:
            return
        try:
            if self.introspector is None:
                optimizer = getattr(self.model, "optimizer", None)
                step = int(optimizer.iterations.value) if optimizer is not None else 0
                self.introspector = Introspector(
                    self.log_dir, self.model, None, self.every, views=self.views,
                    initial_step=step, initial_epoch=epoch, discover=keras_parts,
                    **self.options)
                self._metrics = mean_metrics(self.model)
            # fit reset the metrics before this call: a step's value is the change from here
            self._before = [self._totals(m) for m in self._metrics]
        except Exception as e:
            self._off(e)

    @staticmethod
    def _totals(metric: Any) -> tuple[torch.Tensor, torch.Tensor]:
        return (metric.total.value.detach().clone(), metric.count.value.detach().clone())

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        intro = self.introspector
        if intro is None:
            return
        try:
            if self.model.steps_per_execution > 1 and not self._said_executions:
                self._said_executions = True
                warn("steps_per_execution > 1 on the PyTorch backend: each execution is"
                     " logged as one step, its last step's gradients")
            values = {}
            for i, m in enumerate(self._metrics):
                total, count = self._totals(m)
                t0, c0 = self._before[i]
                values[m.name] = (total - t0) / (count - c0)
                self._before[i] = (total, count)
            intro.step(**values)
        except FindingStop:  # on_finding="stop": the point is written; fit ends its way
            self.model.stop_training = True
        except Exception as e:
            self._off(e)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        intro = self.introspector
        if intro is None:
            return
        try:
            intro.end_epoch(**{k: v for k, v in (logs or {}).items() if k.startswith("val_")})
        except FindingStop:
            self.model.stop_training = True
        except Exception as e:
            self._off(e)

    def on_train_end(self, logs: dict | None = None) -> None:
        self._close()
