"""Training overhead of ``tb_introspect.jax.Introspector`` on a jitted Flax Linen step.

The reference CNN of ``overhead.py`` written in Flax Linen (``--model cnn``; ``tiny`` for a
smoke run), trained by a jitted optax Adam step on random CIFAR-shaped batches. Variants,
each with its own copy of the same initial parameters: the plain step; the step with the
``Introspector`` at the default (``every="epoch"``) and at ``every=16`` (every Linen layer and
ReLU tapped, output gradients through their perturbations: all four views); and the plain
step with what Flax users log today, ``flax.metrics.tensorboard`` histograms of every
parameter once per epoch. After a warm-up epoch each (compilation), rounds of one epoch per
variant, interleaved (the order rotates every round); each figure is the median over rounds
of the per-round ratio to the plain step, wall and CPU (every thread of the process: XLA's
too).

    python benchmarks/jax_overhead.py                 # the table of docs/benchmarks.md
    python benchmarks/jax_overhead.py --model tiny --steps 2 --rounds 1  # smoke run
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable

CONFIGS = ("plain step", "Introspector(every='epoch')", "Introspector(every=16)",
           "flax histograms per epoch")


def make_model(kind: str):
    import flax.linen as nn

    from tb_introspect.jax import tap

    class CNN(nn.Module):
        """overhead.py's reference CNN: two blocks of two 3x3 convolutions and a pooling,
        a 128-unit dense layer, 10 logits."""

        widths: tuple[int, ...] = (32, 64)
        dense: int = 128

        @nn.compact
        def __call__(self, x):
            n = 0
            for w in self.widths:
                for _ in range(2):
                    x = tap(self, nn.relu(nn.Conv(w, (3, 3))(x)), f"relu_{n}")
                    n += 1
                x = nn.max_pool(x, (2, 2), (2, 2))
            x = x.reshape(x.shape[0], -1)
            x = tap(self, nn.relu(nn.Dense(self.dense)(x)), f"relu_{n}")
            return nn.Dense(10)(x)

    return CNN() if kind == "cnn" else CNN(widths=(4,), dense=8)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=("cnn", "tiny"), default="cnn")
    p.add_argument("--steps", type=int, default=96, help="steps per epoch")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)

    import jax
    import numpy as np
    import optax
    from flax.metrics import tensorboard

    from tb_introspect.jax import Introspector, tap_layers

    rng = np.random.default_rng(0)
    size = 32 if args.model == "cnn" else 8
    xs = rng.normal(size=(args.steps, args.batch, size, size, 3)).astype(np.float32)
    ys = rng.integers(0, 10, (args.steps, args.batch)).astype(np.int32)
    model = make_model(args.model)
    opt = optax.adam(1e-3)
    folder = tempfile.mkdtemp(prefix="jax_overhead_")

    def loss_plain(params, x, y):
        logits = model.apply({"params": params}, x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    @jax.jit
    def plain_step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(loss_plain)(params, x, y)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    with tap_layers():
        variables = model.init(jax.random.key(0), xs[0])
    params0, taps = variables["params"], variables["perturbations"]

    def loss_tapped(params, taps, x, y):
        with tap_layers():
            logits, outs = model.apply({"params": params, "perturbations": taps}, x,
                                       mutable=["intermediates"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean(), outs

    outputs = loss_tapped(params0, taps, xs[0], ys[0])[1]

    intros = {}

    def instrumented(every: str | int) -> Callable[[], None]:
        intro = intros[every] = Introspector(f"{folder}/{every}", params0, outputs=outputs,
                                             every=every)

        @jax.jit
        def step(params, opt_state, stats, x, y):
            (loss, outs), (grads, out_grads) = jax.value_and_grad(
                loss_tapped, (0, 1), has_aux=True)(params, taps, x, y)
            stats = intro.fold(stats, grads=grads, outputs=outs, output_grads=out_grads)
            updates, opt_state = opt.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, stats, loss

        state = {"params": params0, "opt": opt.init(params0), "stats": intro.init()}

        def epoch() -> None:
            p, o, s = state["params"], state["opt"], state["stats"]
            for x, y in zip(xs, ys, strict=True):
                p, o, s, loss = step(p, o, s, x, y)
                s = intro.step(s, p, loss=loss)
            s = intro.end_epoch(s, p)
            jax.block_until_ready(p)
            state.update(params=p, opt=o, stats=s)
        return epoch

    def plain(histograms: bool) -> Callable[[], None]:
        writer = tensorboard.SummaryWriter(f"{folder}/flax") if histograms else None
        state = {"params": params0, "opt": opt.init(params0), "epoch": 0}

        def epoch() -> None:
            p, o = state["params"], state["opt"]
            for x, y in zip(xs, ys, strict=True):
                p, o, loss = plain_step(p, o, x, y)
            jax.block_until_ready(p)
            if writer is not None:
                state["epoch"] += 1
                for path, leaf in jax.tree_util.tree_flatten_with_path(p)[0]:
                    writer.histogram(jax.tree_util.keystr(path), np.asarray(leaf),
                                     state["epoch"])
                writer.flush()
            state.update(params=p, opt=o)
        return epoch

    epochs = {CONFIGS[0]: plain(False), CONFIGS[1]: instrumented("epoch"),
              CONFIGS[2]: instrumented(16), CONFIGS[3]: plain(True)}
    for run in epochs.values():  # warm-up: compilation
        run()
    times: dict[str, list[tuple[float, float]]] = {c: [] for c in CONFIGS}
    for r in range(args.rounds):
        order = CONFIGS[r % len(CONFIGS):] + CONFIGS[:r % len(CONFIGS)]
        for name in order:
            wall, cpu = time.perf_counter(), time.process_time()
            epochs[name]()
            times[name].append((time.perf_counter() - wall, time.process_time() - cpu))

    print(f"\n{args.model}, {args.steps} steps of batch {args.batch}, {args.rounds} rounds"
          f" (JAX {jax.__version__}, {jax.devices()[0].platform})\n")
    print("| variant | statistics steps an epoch | epoch wall (s) | wall vs plain |"
          " CPU vs plain |")
    print("|---|---|---|---|---|")
    for name, every in zip(CONFIGS, (None, "epoch", 16, None), strict=True):
        wall = [t[0] / b[0] for t, b in zip(times[name], times[CONFIGS[0]], strict=True)]
        cpu = [t[1] / b[1] for t, b in zip(times[name], times[CONFIGS[0]], strict=True)]
        done = ("-" if every is None else str(intros[every].governor.last_window[0]
                                              if every == "epoch" else args.steps // every))
        print(f"| {name} | {done} | {statistics.median(t[0] for t in times[name]):.3f} |"
              f" {statistics.median(wall):.2f}x | {statistics.median(cpu):.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
