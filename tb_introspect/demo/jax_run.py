"""The demo scenarios trained with JAX and Flax (``tb-introspect demo --framework jax``): the
same digits, batches, epochs and models as the Keras demo, logged by
``tb_introspect.jax.Introspector`` into the same kind of runs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TextIO

import numpy as np

from tb_introspect.demo.data import Digits
from tb_introspect.demo.loops import Run
from tb_introspect.demo.models import BATCH_SIZE, EPOCHS, RunResult, Scenario


def train_scenarios(
    chosen: Sequence[Scenario], paths: Sequence[str], data: Digits, *, epochs: int | None,
    quick: bool, every: str | int, seed: int, progress: bool, stream: TextIO,
) -> list[RunResult]:
    """Train each scenario into its run directory; the ``RunResult`` of each."""
    import jax
    import jax.numpy as jnp

    from tb_introspect.demo import jax_models
    from tb_introspect.jax import Introspector

    # Whole batches only: a jitted step compiles once per batch shape, and the
    # perturbations that give the output gradients have the batch's shape.
    steps_per_epoch = len(data.x_train) // BATCH_SIZE
    results = []
    for i, (scenario, path) in enumerate(zip(chosen, paths, strict=True), start=1):
        n_epochs = epochs or (scenario.quick_epochs if quick else EPOCHS)
        model, opt, rectifiers = jax_models.build(scenario.name)
        variables = model.init(jax.random.key(seed), data.x_train[:BATCH_SIZE])
        params, taps = variables["params"], variables["perturbations"]
        opt_state = opt.init(params)

        loss_fn, train_step, evaluate = _functions(model, opt, taps)
        _, (outputs, _) = loss_fn(params, taps, data.x_train[:BATCH_SIZE],
                                  data.y_train[:BATCH_SIZE])
        intro = Introspector(path, params, outputs=outputs, every=every, seed=seed,
                             rectifiers=rectifiers or None)
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
                    params, opt_state, stats, loss, accuracy = train_step(
                        intro, params, opt_state, stats, data.x_train[idx], data.y_train[idx])
                    stats = intro.step(stats, params, loss=loss, accuracy=accuracy)
                    losses.append(loss)
                    run.stepped()
                val_loss, val_acc = (float(v) for v in evaluate(params, data.x_val, data.y_val))
                stats = intro.end_epoch(stats, params, val_loss=val_loss, val_accuracy=val_acc)
                run.epoch(float(jnp.mean(jnp.stack(losses))), val_loss, val_acc)
        results.append(run.result())
    return results


def _functions(model, opt, taps):
    """The loss, the jitted train step (the ``Introspector`` its static first argument) and
    the jitted evaluation of one scenario."""
    from functools import partial

    import jax
    import jax.numpy as jnp
    import optax

    def loss_fn(params, taps, x, y):
        logits, outs = model.apply({"params": params, "perturbations": taps}, x,
                                   mutable=["intermediates"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean(), (outs, logits)

    @partial(jax.jit, static_argnums=0)
    def train_step(intro, params, opt_state, stats, x, y):
        (loss, (outs, logits)), (grads, out_grads) = jax.value_and_grad(
            loss_fn, (0, 1), has_aux=True)(params, taps, x, y)
        stats = intro.fold(stats, grads=grads, outputs=outs, output_grads=out_grads)
        updates, opt_state = opt.update(grads, opt_state, params)
        accuracy = jnp.mean(jnp.argmax(logits, -1) == y)
        return optax.apply_updates(params, updates), opt_state, stats, loss, accuracy

    @jax.jit
    def evaluate(params, x, y):
        # without the perturbations and intermediates the taps do nothing
        logits = model.apply({"params": params}, x)
        return (optax.softmax_cross_entropy_with_integer_labels(logits, y).mean(),
                jnp.mean(jnp.argmax(logits, -1) == y))

    return loss_fn, train_step, evaluate
