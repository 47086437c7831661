"""``Introspect`` on Keras's JAX backend: ``tb_introspect.jax``'s engine under ``fit``.

On this backend ``fit`` runs a jitted, stateless train step on a state it threads through
(trainable, non-trainable, optimizer and metric variables), and a callback sees nothing of
the step but its logs. So for the length of each ``fit`` the callback puts its own train
step in the model's ``train_function``: Keras's step (``compute_loss_and_updates``, the
optimizer's ``stateless_apply``, the metrics' update) with the captured layers' outputs kept
while it is traced, a zero added to each (whose gradient is the output gradient) on the
statistics steps, and ``tb_introspect.jax``'s fold of the gradients and outputs into the
state the callback carries beside Keras's. Keras's state keeps its shape and no variable is
added to the model, so checkpoints are the model's own; at the end of ``fit`` the model's
train function is Keras's again.

The names are the TensorFlow callback's: a variable by its path, an output by its layer
(``model_parts.layers_to_capture``); a rectifier is told by its layer's type. Each step's
loss and metrics are each ``Mean`` metric's change in total and count, computed in the step.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import keras

from tb_introspect import slots
from tb_introspect.jax.carry import OFF, STATS, Carry
from tb_introspect.jax.introspector import Introspector
from tb_introspect.jax.pacing import Pacing
from tb_introspect.keras.engine_callback import EngineCallback
from tb_introspect.keras.model_parts import (
    CapturedLayer,
    is_rectifier,
    layers_to_capture,
    mean_metrics,
    variable_owners,
)
from tb_introspect.pipeline.failures import warn
from tb_introspect.pipeline.findings import FindingStop
from tb_introspect.pipeline.options import OptionArgs

if TYPE_CHECKING:
    from typing_extensions import Unpack


class _KerasIntrospector(Introspector):
    """The JAX engine over a Keras model: a parameter's layer is the layer that holds the
    variable, a rectifier is told by its layer's type."""

    def __init__(self, *args: Any, owners: dict[str, str], exact: set[str],
                 **kwargs: Any) -> None:
        self._owners, self._exact_layers = owners, exact
        super().__init__(*args, **kwargs)

    def _param_layer(self, name: str) -> str:
        return self._owners[name]

    def _exact(self, name: str) -> bool:
        return name in self._exact_layers


class _Taps:
    """While a step is traced, each captured layer's ``call`` keeps its output (one per
    call) and adds the zero of ``perturb`` to it, whose gradient is the output gradient."""

    def __init__(self, layers: list[CapturedLayer]) -> None:
        self.layers = layers

    def trace(self, run: Callable[[], Any],
              perturb: dict[str, list] | None) -> tuple[Any, dict[str, list]]:
        kept: dict[str, list] = {}
        wrapped = []
        for entry in self.layers:
            layer, name = entry.layer, entry.name
            original = layer.call

            def call(*args: Any, _call: Callable = original, _name: str = name,
                     **kwargs: Any) -> Any:
                out = _call(*args, **kwargs)
                if not isinstance(out, jax.Array) or not jnp.issubdtype(out.dtype,
                                                                        jnp.floating):
                    return out  # several outputs, or integers: no statistics
                calls = kept.setdefault(_name, [])
                calls.append(out)
                if perturb is not None and len(perturb.get(_name, ())) >= len(calls):
                    out = out + perturb[_name][len(calls) - 1]
                return out

            layer.call = call  # an instance attribute, over the class's method
            wrapped.append(layer)
        try:
            return run(), kept
        finally:
            for layer in wrapped:
                del layer.call


class Introspect(EngineCallback):
    """The Keras callback on the JAX backend (``KERAS_BACKEND=jax``): the same views,
    options and findings as on TensorFlow, from an unmodified ``fit``.

    Example:
        >>> from tb_introspect.keras import Introspect
        >>> model.fit(x, y, epochs=10, callbacks=[Introspect("logs/run1")])  # doctest: +SKIP
    """

    def __init__(self, log_dir: str | os.PathLike, views: Sequence[str] = slots.VIEWS,
                 every: str | int = "epoch", **options: Unpack[OptionArgs]):
        super().__init__(log_dir, views, every, **options)
        self.introspector: _KerasIntrospector | None = None
        self._carry: Carry | None = None
        self._keras_function: Any = None  # the model's train function, put back at the end
        self._steps: dict[bool, Callable] = {}  # jitted: instrumented or plain
        self._fit_model: Any = None
        self._pacing: Pacing | None = None
        self._epoch = self._initial_step = 0

    # ------------------------------------------------------------------ fit's hooks

    def on_train_begin(self, logs: dict | None = None) -> None:
        if self._stopped:
            return
        try:
            # Inside a step this callback reads the model as ``_fit_model``: on JAX a
            # callback's ``self.model`` first syncs Keras's state to the variables, which
            # mid-step would hand the variables arrays the step has already consumed.
            model = self._fit_model = self.model
            own = [f for f in ("train_step", "compute_loss_and_updates")
                   if getattr(type(model), f) is not getattr(keras.Model, f)]
            if own:
                warn(f"this model has its own {own[0]}(): on the JAX backend Introspect runs"
                     " Keras's train step to see inside it, so it stays off and this fit()"
                     " is trained by the model's own step, without statistics")
                self._stopped = True
                return
            # read now: during an epoch Keras holds the variables' values in its state
            optimizer = getattr(model, "optimizer", None)
            self._initial_step = int(optimizer.iterations.value) if optimizer else 0
            self._keras_function = model.train_function
            model.train_function = model._make_function(self._train_step)
        except Exception as e:
            self._off(e)

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._epoch = epoch

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        intro = self.introspector
        if intro is None:
            return
        try:
            self._carry = intro.end_epoch(
                self._carry, self._params(v.value for v in self.model.trainable_variables),
                **{k: v for k, v in (logs or {}).items() if k.startswith("val_")})
        except FindingStop:
            self.model.stop_training = True
        except Exception as e:
            self._off(e)

    def on_train_end(self, logs: dict | None = None) -> None:
        if self._keras_function is not None:
            self.model.train_function, self._keras_function = self._keras_function, None
        self._close()

    # ------------------------------------------------------------------ the train step

    def _train_step(self, state: tuple, data: Any) -> tuple[Any, tuple]:
        """One step of ``fit``: Keras's, instrumented while this callback logs."""
        if self._stopped:
            return self._jitted(False)(state, data)
        try:
            if self.introspector is None:
                self._start(state, data)
            logs, state, carry, values = self._jitted(True)(state, self._carry, data)
        except Exception as e:
            # Failed while tracing, before the state was handed over: Keras's step runs it.
            self._off(e)
            return self._jitted(False)(state, data)
        try:
            self._carry = self.introspector.step(carry, self._params(state[0]), **values)
        except FindingStop:  # on_finding="stop": the point is written; fit ends its way
            self._fit_model.stop_training = True
        except Exception as e:
            self._off(e)
        return logs, state

    def _jitted(self, instrumented: bool) -> Callable:
        step = self._steps.get(instrumented)
        if step is None:
            model = self._fit_model
            step = self._instrumented_step if instrumented else model.train_step
            if not model.run_eagerly and model.jit_compile:
                step = jax.jit(step, donate_argnums=(0, 1) if instrumented else 0)
            self._steps[instrumented] = step
        return step

    def _start(self, state: tuple, data: Any) -> None:
        model = self._fit_model
        layers = layers_to_capture(model)
        self._taps = _Taps(layers)
        owner = variable_owners(layers)
        variables = model.trainable_variables
        self._paths = [v.path for v in variables]
        self._metrics = [(m.name, *(_index(model.metrics_variables, v)
                                    for v in (m.total, m.count)))
                         for m in mean_metrics(model)]
        kept = self._output_shapes(state, data)
        kept = {e.name: kept[e.name] for e in layers if e.name in kept}  # in model order
        self.introspector = _KerasIntrospector(
            self.log_dir, self._params(state[0]), kept, self.every, views=self.views,
            initial_step=self._initial_step,
            initial_epoch=self._epoch, owners={v.path: owner.get(id(v), model.name)
                                                 for v in variables},
            exact={e.name for e in layers if is_rectifier(e.layer)}, **self.options)
        if self._pacing is not None:  # an earlier fit timed these steps already
            self.introspector.pacing.resume(self._pacing)
        self._pacing = self.introspector.pacing
        self._carry = self.introspector.init()

    def _params(self, values: Any) -> dict[str, Any]:
        return dict(zip(self._paths, values, strict=True))

    def _output_shapes(self, state: tuple, data: Any) -> dict[str, list]:
        """The kept outputs' shapes and dtypes: the instrumented forward pass traced, not
        run."""
        return jax.eval_shape(lambda s: self._forward(s, data, None), state)[1]

    def _forward(self, state: tuple, data: Any, perturb: dict | None,
                 trainable: list | None = None) -> tuple[Any, dict[str, list]]:
        """Keras's loss and updates of ``state`` on ``data``, the layers' outputs kept."""
        tv, ntv, ov, mv = state
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        return self._taps.trace(lambda: self._fit_model.compute_loss_and_updates(
            tv if trainable is None else trainable, ntv, mv, x, y, sample_weight,
            training=True, optimizer_variables=ov), perturb)

    def _instrumented_step(self, state: tuple, carry: Carry,
                           data: Any) -> tuple[Any, tuple, Carry, dict]:
        """Keras's ``train_step`` (``keras/src/backend/jax/trainer.py``) with the fold."""
        model = self._fit_model
        tv, ntv, ov, mv = state
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        perturb = None
        if carry.phase == STATS and "output_gradient" in self.introspector.plan.output_views:
            perturb = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype),
                                   self._output_shapes(state, data))

        def loss_fn(trainable: list, perturb: dict | None) -> tuple:
            (loss, aux), kept = self._forward(state, data, perturb, trainable)
            return loss, (aux, kept)

        (_, (aux, kept)), (grads, output_grads) = jax.value_and_grad(
            loss_fn, argnums=(0, 1), has_aux=True)(tv, perturb)
        unscaled_loss, y_pred, ntv, metrics_before = aux
        # The gradients of the loss, not of the loss the optimizer scaled (mixed precision's
        # LossScaleOptimizer, ``loss_scale_factor``): what its ``stateless_apply`` divides by.
        mapping = list(zip(model.optimizer.variables, ov, strict=True))
        with keras.StatelessScope(state_mapping=mapping):
            scale = model.optimizer.scale_loss(1.0)
        tv_new, ov = model.optimizer.stateless_apply(ov, grads, tv)
        logs, mv_after = model._update_metrics_variables(
            metrics_before, unscaled_loss, x, y, y_pred, sample_weight)
        if not isinstance(scale, float):
            grads, output_grads = jax.tree.map(lambda g: g / scale.astype(g.dtype),
                                               (grads, output_grads))
        carry = self.introspector.fold(
            carry, grads=self._params(grads), outputs=kept if carry.phase != OFF else None,
            output_grads=output_grads)
        # A step's value of a mean metric: its change in total over its change in count.
        values = {name: (mv_after[t] - mv[t]) / (mv_after[c] - mv[c])
                  for name, t, c in self._metrics}
        return logs, (tv_new, ntv, ov, mv_after), carry, values


def _index(variables: list, variable: Any) -> int:
    return next(i for i, v in enumerate(variables) if v is variable)
