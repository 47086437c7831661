"""The demo scenarios trained with JAX and Flax (``tb-introspect demo --framework jax``,
``--flax nnx`` for Flax NNX): the same digits, batches, epochs and models as the Keras demo,
logged by ``tb_introspect.jax.Introspector`` into the same kind of runs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TextIO

import numpy as np

from tb_introspect.demo.data import Digits
from tb_introspect.demo.loops import Run
from tb_introspect.demo.models import BATCH_SIZE, EPOCHS, RunResult, Scenario


def train_scenarios(
    chosen: Sequence[Scenario], paths: Sequence[str], data: Digits, *, epochs: int | None,
    quick: bool, every: str | int, seed: int, progress: bool, stream: TextIO,
    flax: str = "linen",
) -> list[RunResult]:
    """Train each scenario into its run directory; the ``RunResult`` of each."""
    import jax.numpy as jnp

    from tb_introspect.demo import jax_models
    from tb_introspect.jax import Introspector

    # Whole batches only: a jitted step compiles once per batch shape, and the
    # perturbations that give the output gradients have the batch's shape.
    steps_per_epoch = len(data.x_train) // BATCH_SIZE
    first = data.x_train[:BATCH_SIZE], data.y_train[:BATCH_SIZE]
    results = []
    for i, (scenario, path) in enumerate(zip(chosen, paths, strict=True), start=1):
        n_epochs = epochs or (scenario.quick_epochs if quick else EPOCHS)
        model, opt, rectifiers = jax_models.build(scenario.name, seed, flax)
        trainer = (_Linen if flax == "linen" else _Nnx)(model, opt, seed, *first)
        intro = Introspector(path, trainer.params(), outputs=trainer.outputs, every=every,
                             seed=seed, rectifiers=rectifiers or None)
        order = np.random.default_rng(seed)
        run = Run(scenario, path, n_epochs, steps_per_epoch, index=f"[{i}/{len(chosen)}]",
                  progress=progress, stream=stream)
        with intro:
            stats = intro.init()
            for _epoch in range(n_epochs):
                perm = order.permutation(len(data.x_train))
                losses = []
                for b in range(steps_per_epoch):
                    idx = perm[b * BATCH_SIZE:(b + 1) * BATCH_SIZE]
                    stats, loss, accuracy = trainer.step(intro, stats, data.x_train[idx],
                                                         data.y_train[idx])
                    stats = intro.step(stats, trainer.params(), loss=loss, accuracy=accuracy)
                    losses.append(loss)
                    run.stepped()
                val_loss, val_acc = (float(v) for v in trainer.evaluate(data.x_val, data.y_val))
                stats = intro.end_epoch(stats, trainer.params(), val_loss=val_loss,
                                        val_accuracy=val_acc)
                run.epoch(float(jnp.mean(jnp.stack(losses))), val_loss, val_acc)
        results.append(run.result())
    return results


def _cross_entropy(logits: Any, y: Any) -> tuple[Any, Any]:
    """The mean loss and the accuracy of ``logits`` against labels ``y``."""
    import jax.numpy as jnp
    import optax

    return (optax.softmax_cross_entropy_with_integer_labels(logits, y).mean(),
            jnp.mean(jnp.argmax(logits, -1) == y))


class _Linen:
    """A Linen model's training: parameters and optimizer state passed through a jitted
    step (the ``Introspector`` its static first argument), its layers tapped by
    ``taps.tap`` into the ``intermediates`` and ``perturbations`` collections."""

    def __init__(self, model: Any, opt: Any, seed: int, x: Any, y: Any) -> None:
        from functools import partial

        import jax
        import optax

        variables = model.init(jax.random.key(seed), x)
        self._params, taps = variables["params"], variables["perturbations"]
        self._opt_state = opt.init(self._params)

        def loss_fn(params, taps, x, y):
            logits, outs = model.apply({"params": params, "perturbations": taps}, x,
                                       mutable=["intermediates"])
            loss, accuracy = _cross_entropy(logits, y)
            return loss, (outs, accuracy)

        @partial(jax.jit, static_argnums=0)
        def train_step(intro, params, opt_state, stats, x, y):
            (loss, (outs, accuracy)), (grads, out_grads) = jax.value_and_grad(
                loss_fn, (0, 1), has_aux=True)(params, taps, x, y)
            stats = intro.fold(stats, grads=grads, outputs=outs, output_grads=out_grads)
            updates, opt_state = opt.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, stats, loss, accuracy

        # without the perturbations and intermediates the taps do nothing
        self._evaluate = jax.jit(lambda params, x, y: _cross_entropy(
            model.apply({"params": params}, x), y))
        self._train_step = train_step
        _, (self.outputs, _) = loss_fn(self._params, taps, x, y)

    def params(self) -> Any:
        return self._params

    def step(self, intro: Any, stats: Any, x: Any, y: Any) -> tuple[Any, Any, Any]:
        self._params, self._opt_state, stats, loss, accuracy = self._train_step(
            intro, self._params, self._opt_state, stats, x, y)
        return stats, loss, accuracy

    def evaluate(self, x: Any, y: Any) -> tuple[Any, Any]:
        return self._evaluate(self._params, x, y)


class _Nnx:
    """An NNX model's training: the model and its ``nnx.Optimizer`` updated in place by an
    ``nnx.jit`` step, its layers tapped under ``nnx.capture``."""

    def __init__(self, model: Any, opt: Any, seed: int, x: Any, y: Any) -> None:
        from functools import partial

        from flax import nnx

        from tb_introspect.jax import nnx_outputs

        self.model = model
        taps, self.outputs = nnx_outputs(model, x)
        optimizer = nnx.Optimizer(model, opt, wrt=nnx.Param)

        def loss_fn(model, taps, x, y):
            logits, outs = nnx.capture(model, nnx.Intermediate, init=taps)(x)
            loss, accuracy = _cross_entropy(logits, y)
            return loss, (outs, accuracy)

        @partial(nnx.jit, static_argnums=0)
        def train_step(intro, model, optimizer, taps, stats, x, y):
            (loss, (outs, accuracy)), (grads, out_grads) = nnx.value_and_grad(
                loss_fn, argnums=(0, 1), has_aux=True)(model, taps, x, y)
            stats = intro.fold(stats, grads=grads, outputs=outs, output_grads=out_grads)
            optimizer.update(model, grads)
            return stats, loss, accuracy

        self._step = lambda intro, stats, x, y: train_step(intro, model, optimizer, taps,
                                                           stats, x, y)
        # outside nnx.capture the taps do nothing
        self._evaluate = nnx.jit(lambda model, x, y: _cross_entropy(model(x), y))

    def params(self) -> Any:
        from flax import nnx

        return nnx.state(self.model, nnx.Param)

    def step(self, intro: Any, stats: Any, x: Any, y: Any) -> tuple[Any, Any, Any]:
        return self._step(intro, stats, x, y)

    def evaluate(self, x: Any, y: Any) -> tuple[Any, Any]:
        return self._evaluate(self.model, x, y)
