"""``Introspector``: the four views of a jitted JAX train step (Flax Linen or NNX, optax),
in the tab's format.

JAX keeps no state between calls of a jitted function, so what a window accumulates lives
in a pytree the train step carries (``init``): the gradient sums, the layer outputs' and
output gradients' states (``fold.py``), and the step's phase, which the host sets between
steps. ``fold`` is the pure part, called inside the user's jitted step on what it computed
anyway: the gradients, the intermediates (Linen's ``capture_intermediates`` or ``sow``,
NNX's ``sow``) and their gradients (Linen's ``perturb``). ``step`` is the host part,
called after each step with the carried state and the parameters: it counts steps and,
when a point is due, takes a device copy of both (no wait: JAX arrays are immutable and
the copy is queued behind the step) and hands the rest to the pipeline's worker, which
reads them to the host beside the next steps and finalizes with ``stats_np``, as the
other front-ends do. Between points nothing is read back to the host.

The phase of each step (``Phase``): with ``every="epoch"`` the first step of each window
and every ``stats_every``-th one after it compute the outputs' statistics, the others
only the gradient sum and the rectifier outputs' activity counts (an output named
``relu``, ``relu_0``, ``relu6``..., or one ``rectifiers=`` names: a JAX activation is a
function, with no layer type to tell a ReLU by); with ``every=N``, the N-th
steps, and nothing in between. ``overhead`` spaces the statistics steps once, from the first
steps timed by waiting for them (``pacing.py``): a jitted step returns before it runs, so
the host cannot time every step as the other front-ends do.
"""

from __future__ import annotations

import os
import re
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from tb_introspect import slots, stats_np
from tb_introspect.jax import fold as folds
from tb_introspect.jax.carry import LEAN, OFF, STATS, Carry
from tb_introspect.jax.pacing import Pacing
from tb_introspect.jax.trees import ROOT, call_order, layer_order, named_leaves
from tb_introspect.pipeline.failures import METRICS, STATISTICS, Part, warn
from tb_introspect.pipeline.governor import Governor
from tb_introspect.pipeline.metrics import MetricCells
from tb_introspect.pipeline.options import OptionArgs, Options, check_log_dir, matches
from tb_introspect.pipeline.params import Params
from tb_introspect.pipeline.pipeline import Pipeline
from tb_introspect.pipeline.plan import Monitored, Plan, is_sampled, sanitize
from tb_introspect.pipeline.point import Block, Point
from tb_introspect.pipeline.sink import EventSink
from tb_introspect.stats_np import segments

if TYPE_CHECKING:
    from typing_extensions import Unpack

@dataclass
class _Output:
    """One monitored layer output: its spec and its segment (the same layout in both
    output views)."""

    spec: Monitored
    seg: segments.Segment
    example: Any = None  # its first call's shape and dtype
    index: int = 0  # in ``plan.outputs``


def is_rectifier(name: str) -> bool:
    """Whether an output's name says it is a ReLU's (``relu``, ``relu6``, ``relu_2``...):
    a JAX activation is a function, so its name is all there is to tell it by."""
    return re.fullmatch(r"relu6?(_?\d+)?", name.rpartition("/")[2], re.IGNORECASE) is not None


class _Metrics(MetricCells):
    """Metric cells holding JAX scalars as they are (immutable: no copy), read to the
    host in one ``device_get``."""

    def keep(self, name: str, value: Any) -> Any:
        if isinstance(value, jax.Array):
            if value.size != 1:
                raise ValueError(f"metric {name!r} is an array of shape {value.shape};"
                                 " a metric is one number")
            return value.reshape(())
        return float(value)

    def read(self) -> tuple[list[str], np.ndarray, np.ndarray]:
        numbers, kept = self.numbers()
        if kept:
            at, values = zip(*kept, strict=True)
            numbers[list(at)] = np.asarray(jax.device_get(list(values)), np.float64)
        return (list(self.names), numbers.reshape(self.rows, len(self.names)),
                self.counts.copy())


class Introspector:
    """Per-layer statistics of a JAX training loop, written to ``log_dir``.

    ``params``: the trainable parameters (a Linen ``variables["params"]``, an NNX
    ``nnx.state(model, nnx.Param)``, any pytree of arrays); ``outputs``: the layer outputs
    the step will hand to ``fold``, as arrays or ``jax.ShapeDtypeStruct`` (e.g. from
    ``jax.eval_shape``); None: no output views. ``every`` and the keyword options are
    the other front-ends' (``docs/options.md``).

    In the jitted step, ``stats = intro.fold(stats, grads=..., outputs=...,
    output_grads=...)``; after it, on the host, ``stats = intro.step(stats, params,
    loss=loss)``; after each epoch ``stats = intro.end_epoch(stats, params)``; ``close()``
    at the end (or a ``with`` block).

    Example:
        >>> import tempfile, jax, jax.numpy as jnp, optax
        >>> from tb_introspect.jax import Introspector
        >>> params = {"w": jnp.ones((4, 1)), "b": jnp.zeros(1)}
        >>> opt = optax.sgd(0.1); opt_state = opt.init(params)
        >>> def loss_fn(p, x):
        ...     h = x @ p["w"] + p["b"]
        ...     return ((h - 1.0) ** 2).mean(), {"head": h}
        >>> x = jnp.ones((8, 4))
        >>> intro = Introspector(tempfile.mkdtemp(), params, outputs={"head": x[:, :1]})
        >>> @jax.jit
        ... def train_step(params, opt_state, stats, x):
        ...     (loss, acts), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, x)
        ...     stats = intro.fold(stats, grads=grads, outputs=acts)
        ...     updates, opt_state = opt.update(grads, opt_state)
        ...     return optax.apply_updates(params, updates), opt_state, stats, loss
        >>> with intro:
        ...     stats = intro.init()
        ...     for epoch in range(2):
        ...         for _ in range(5):
        ...             params, opt_state, stats, loss = train_step(params, opt_state,
        ...                                                         stats, x)
        ...             stats = intro.step(stats, params, loss=loss)
        ...         stats = intro.end_epoch(stats, params)
    """

    def __init__(
        self,
        log_dir: str | os.PathLike,
        params: Any,
        outputs: Any = None,
        every: str | int = "epoch",
        *,
        views: Sequence[str] = slots.VIEWS,
        initial_step: int = 0,
        initial_epoch: int = 0,
        **options: Unpack[OptionArgs],
    ):
        options = Options.of(views, every, options)
        self.options = options
        self.plan = Plan(options)
        self.failures = self.plan.failures
        self.log_dir = check_log_dir(os.fspath(log_dir))
        self.step_count = int(initial_step)
        self.epoch = int(initial_epoch)
        self._window = self._stats_steps = 0
        self._closed = False
        chosen = (lambda name: True) if options.layers is None else (
            lambda name: matches(options.layers, name))
        self._param_tree = jax.tree_util.tree_structure(params)
        named = named_leaves(params)
        self._param_shapes = [jax.ShapeDtypeStruct(leaf.shape, leaf.dtype) for _, leaf in named]
        layer_of = [self._param_layer(name) for name, _ in named]
        self._param_leaves = [i for i, layer in enumerate(layer_of) if chosen(layer)]
        out_named = named_leaves(outputs, calls=True) if outputs is not None else []
        layers = layer_order(call_order(outputs) if outputs is not None else [], layer_of)
        depth = {layer: i for i, layer in enumerate(layers)}
        self.plan.variables = [
            Monitored("variable", sanitize(named[i][0]), layer_of[i], depth[layer_of[i]],
                      tuple(named[i][1].shape), str(named[i][1].dtype))
            for i in self._param_leaves]
        self._outputs: list[_Output] = []
        if self.plan.output_views:
            by_name: dict[str, _Output] = {}
            for name, leaf in out_named:
                if not chosen(name):
                    continue
                shape = tuple(int(d) for d in leaf.shape)
                seg = segments.layout(shape, False, options.step_sample_size)
                out = by_name.get(name)
                if out is None:
                    spec = Monitored(
                        "output", sanitize(name), name, depth[name],
                        segments.channels_last_shape(shape, False), str(leaf.dtype),
                        exact=self._exact(name) or matches(options.rectifiers, name))
                    out = by_name[name] = _Output(spec, seg, jax.ShapeDtypeStruct(
                        leaf.shape, leaf.dtype))
                elif (seg.channels, seg.positions) != (out.seg.channels, out.seg.positions):
                    raise ValueError(f"layer output {name!r}: calls of shapes"
                                     f" {out.spec.shape} and {shape} cannot be folded together")
            self._outputs = sorted(by_name.values(), key=lambda o: o.spec.depth)
            for i, out in enumerate(self._outputs):
                out.index = i
        self.plan.outputs = [o.spec for o in self._outputs]
        self._output_names = {name for name, _ in out_named}
        self.governor = Governor(None, self.plan.stats_every)
        self.pacing = Pacing(self.governor, options.overhead if self.plan.per_epoch else None,
                             lean_work=self._lean_work)
        self.metric_cells = _Metrics()
        self.params_host = Params(self.plan, None, channels_first=False)
        self._params: Any = None
        self._carry: Carry | None = None
        self._reset = False
        self._last_window = 0
        self._checked = False
        if self.plan.want("variable"):  # the first update ratio's reference: the weights now
            self.params_host.w_prev = [np.array(a) for a in jax.device_get(
                self._chosen_params(params))]
        sink = EventSink(self.log_dir, upload_secs=options.flush_secs)
        if jax.process_count() > 1:
            # A point reads arrays whole on the host, which one process cannot do for an
            # array spread over several: said once, and only the metrics are written.
            warn(f"this JAX program runs in {jax.process_count()} processes; the statistics"
                 " are taken in one process only (any number of its devices): they are"
                 " off, the metrics are written by process 0")
            self.failures.off.add(Part(STATISTICS))
            if jax.process_index() != 0:
                sink = None
        # The governor: each window's first step a statistics step (its ends are the
        # pipeline's), the points' worker CPU recorded for the pacing.
        self.pipeline = Pipeline(self, sink, governor=self.governor)
        self.pipeline.start(self.step_count)
        self.pipeline.begin_epoch(self.epoch)
        self._phase = self._next_phase()

    # A front-end built on this one (Keras's JAX backend) knows its layers better than
    # their names say: it overrides these two.
    def _param_layer(self, name: str) -> str:
        """The layer a parameter named ``name`` belongs to: its name's prefix."""
        return name.rpartition("/")[0] or ROOT

    def _exact(self, name: str) -> bool:
        """Whether the layer output ``name`` makes exact zeros (a rectifier's)."""
        return is_rectifier(name)

    # ------------------------------------------------------------------ device side

    def init(self) -> Carry:
        """The state a train step carries: fresh (empty window), phase of the next step."""
        arrays: dict[str, Any] = {
            # the draws' key goes on counting across windows: each window its own draws
            "steps": jnp.asarray(self.step_count % 2**31, jnp.int32),
            "grads": [jnp.zeros(s.shape, jnp.float32) for s in self.plan.variables]
            if self.plan.want("gradient") else [],
        }
        for view in self.plan.output_views:
            arrays[view] = [folds.empty(o.seg) for o in self._outputs]
        return Carry(arrays, self._phase)

    def fold(self, stats: Carry, *, grads: Any = None, outputs: Any = None,
             output_grads: Any = None) -> Carry:
        """Add one step's ``grads`` (the parameters' tree), layer ``outputs`` and their
        ``output_grads`` (the ``outputs`` tree of ``__init__``) to the carried ``stats``,
        as its phase says. Pure: call it inside the jitted step."""
        st = dict(stats.arrays)
        steps = st["steps"]
        if stats.phase != OFF:
            g = [] if grads is None else [jnp.asarray(leaf) for leaf in jax.tree.leaves(grads)]
            key = jax.random.fold_in(jax.random.key(self.options.seed), steps)
            full = stats.phase == STATS
            st = self._fold(st, g, self._by_name(outputs, "outputs"),
                            self._by_name(output_grads, "output_grads") if full else None,
                            key, full)
        st["steps"] = steps + 1
        return Carry(st, stats.phase)

    def _by_name(self, tree: Any, arg: str) -> dict[str, list[jax.Array]] | None:
        """A layer's arrays (one per call) by name: ``output_grads`` are matched to the
        ``outputs`` by name (Linen's ``perturb`` keeps them in another collection)."""
        if tree is None:
            return None
        out: dict[str, list[jax.Array]] = {}
        for name, leaf in named_leaves(tree, calls=True):
            out.setdefault(name, []).append(leaf)
        unknown = sorted(set(out) - self._output_names)
        if unknown:
            raise ValueError(f"fold: {arg} holds {', '.join(map(repr, unknown[:5]))}, which"
                             " the Introspector's outputs= does not name (it names"
                             f" {', '.join(map(repr, sorted(self._output_names)[:5]))})")
        return out

    def _fold(self, st: dict, grads: list, outs: dict | None, out_grads: dict | None,
              key: jax.Array, full: bool) -> dict:
        if grads and st["grads"]:
            st["grads"] = [s + grads[i].astype(jnp.float32)
                           for s, i in zip(st["grads"], self._param_leaves, strict=True)]
        views = {v: list(st[v]) for v, tree in (("output", outs), ("output_gradient", out_grads))
                 if v in st and tree is not None}
        trees = {"output": outs, "output_gradient": out_grads}
        rounds: list[list] = []  # the c-th call of every layer in round c: one state each
        for view, states in views.items():
            for o in self._outputs:
                if not full and not (view == "output" and o.spec.exact):
                    continue
                for call, x in enumerate(trees[view].get(o.spec.layer, ())):
                    if not full:
                        states[o.index] = folds.count(states[o.index], x, o.seg)
                        continue
                    if call == len(rounds):
                        rounds.append([])
                    k = jax.random.fold_in(key, o.index * 2 + (view != "output"))
                    rounds[call].append((states, o, x, jax.random.fold_in(k, call)))
        for items in rounds:  # every tensor's statistics at once (``fold_many``)
            new = folds.fold_many([states[o.index] for states, o, _, _ in items],
                                  [x for _, _, x, _ in items], [o.seg for _, o, _, _ in items],
                                  [k for _, _, _, k in items])
            for (states, o, _, _), state in zip(items, new, strict=True):
                states[o.index] = state
        st.update(views)
        return st

    def _lean_work(self) -> tuple[float, float]:
        """Wall and CPU seconds of a lean step's own work, apart from the step: ``fold`` of
        zeros of the step's gradients and rectifier outputs, compiled, then the median of
        three runs (for the pacing: no step of a run is without it)."""
        grads = [jnp.zeros(s.shape, s.dtype) for s in self._param_shapes]
        outs = {o.spec.layer: [jnp.zeros(o.example.shape, o.example.dtype)]
                for o in self._outputs if o.spec.exact}
        fold = jax.jit(lambda st, g, o: self.fold(st, grads=g, outputs=o or None))
        lean = Carry(self.init().arrays, LEAN)
        times = []
        for _ in range(4):  # the first compiles
            wall, cpu = time.perf_counter(), time.process_time()
            jax.block_until_ready(fold(lean, grads, outs))
            times.append((time.perf_counter() - wall, time.process_time() - cpu))
        return (statistics.median(t[0] for t in times[1:]),
                statistics.median(t[1] for t in times[1:]))

    # ------------------------------------------------------------------ host side

    def step(self, stats: Carry, params: Any = None, loss: Any = None,
             **metrics: Any) -> Carry:
        """After each train step: the carried ``stats`` and the ``params`` it left (read
        only when a point is logged), the step's ``loss`` and other scalar ``metrics``
        (arrays, not read until the pipeline drains them). Returns the state the next step
        carries."""
        if self._closed:
            return stats
        if not self._checked and params is not None:  # a wrong tree says so at once
            self._chosen_params(params)
            self._checked = True
        if self._phase == STATS:
            self._stats_steps += 1
        self.pacing.timed(self._phase == STATS, lambda: jax.block_until_ready(stats.arrays))
        self.governor.ran(self._phase == STATS, None)
        values = dict(metrics)
        if loss is not None:
            values = {"loss": loss, **values}
        self.pipeline.guard(METRICS, self.metric_cells.record, self.step_count, values)
        self.step_count += 1
        self._window += 1
        return self._after(stats, params, lambda: self.pipeline.after_steps(1))

    def end_epoch(self, stats: Carry, params: Any = None, **metrics: Any) -> Carry:
        """After each epoch: the epoch's point (``every="epoch"``), activity maps and metric
        bands; ``metrics`` (e.g. ``val_loss=0.3``) are written at this step."""
        if self._closed:
            return stats
        out = self._after(stats, params, lambda: self.pipeline.end_epoch(metrics))
        self.epoch += 1
        self.pipeline.begin_epoch(self.epoch)
        self.pacing.skip()
        return self._with_phase(out)

    def _after(self, stats: Carry, params: Any, run: Callable[[], None]) -> Carry:
        self._carry, self._params, self._reset = stats, params, False
        try:
            run()
        finally:
            self._carry = self._params = None
        out = self.init() if self._reset else stats
        if self._reset:  # the point's work is no step's time
            self.pacing.skip()
            self.pacing.repace(self._last_window)
        self.pipeline.raise_stop()
        return self._with_phase(out)

    def _with_phase(self, stats: Carry) -> Carry:
        self._phase = self._next_phase()
        return Carry(stats.arrays, self._phase)

    def _next_phase(self) -> int:
        if self.pipeline.is_off(STATISTICS):
            return OFF
        if not self.plan.per_epoch:
            return STATS if is_sampled(self.step_count + 1, self.plan.every) else OFF
        return STATS if self.governor.choose() else LEAN

    def _chosen_params(self, params: Any) -> list:
        leaves = jax.tree.leaves(params)
        if len(leaves) != self._param_tree.num_leaves:
            raise ValueError(f"params: {len(leaves)} arrays where the Introspector was made"
                             f" with {self._param_tree.num_leaves}")
        return [leaves[i] for i in self._param_leaves]

    # The ``pipeline.pipeline.FrontEnd`` protocol.

    @property
    def metric_rows(self) -> int:
        return self.metric_cells.rows

    def current_step(self) -> int:
        return self.step_count

    def read_metrics(self) -> tuple[int, list[str], np.ndarray, np.ndarray]:
        return (self.step_count, *self.metric_cells.read())

    def point(self, step: int) -> Callable[[], Point]:
        """The window's statistics: device copies of the carried state and the parameters
        taken now (queued, no wait), read and finalized on the pipeline's worker."""
        out = Point(window=self._window, stats_steps=self._stats_steps)
        carry = self._carry
        weights = None
        if self.plan.want("variable") and self._params is not None:
            weights = [jnp.copy(a) for a in self._chosen_params(self._params)]
        self._reset = True
        self._last_window = self._window
        self._window = self._stats_steps = 0
        seed = self.options.seed + self.step_count

        def finish() -> Point:
            host = jax.device_get({"carry": None if carry is None else carry.arrays,
                                   "weights": weights})
            c, w = host["carry"], host["weights"]
            sums = None
            if c is not None and c["grads"]:
                sums = [np.asarray(a) for a in c["grads"]]
            ws = None if w is None else [np.asarray(a) for a in w]
            self.params_host.add_blocks(out, ws, sums, seed=seed)
            if c is not None:
                self._output_blocks(out, c)
            return out
        return finish

    def _output_blocks(self, out: Point, carry: Mapping[str, Any]) -> None:
        activity_at = len(segments.ADDITIVE_SLOTS) - 1
        for view in self.plan.output_views:
            specs, states = [], []
            for o, st in zip(self._outputs, carry.get(view, []), strict=False):
                vec = folds.to_segment(st, o.seg)
                if vec[0] == 0 and vec[activity_at] == 0:
                    continue  # not seen in this window
                if view == "output":
                    out.activity[o.index] = vec[activity_at:len(segments.ADDITIVE_SLOTS)
                                                + o.seg.channels + o.seg.positions].copy()
                if vec[0] == 0 or not self.plan.writes(view, o.spec):
                    continue
                specs.append(o.spec)
                states.append(segments.to_state(vec, o.seg, activity_rates=view == "output"))
            if specs:
                out.blocks.append(Block(view, specs, stats_np.finalize_many(
                    states, view, quantiles=self.plan.options.quantiles)))

    def output_widths(self) -> dict[int, tuple[int, int]]:
        return {o.index: (o.seg.channels, o.seg.positions) for o in self._outputs}

    # ------------------------------------------------------------------ lifecycle

    def flush(self) -> None:
        """Write the pending metric values and every point logged so far."""
        self.pipeline.guard(METRICS, self.pipeline.drain)
        self.pipeline.flush()

    def close(self) -> None:
        """Write what is pending and close the event file."""
        if self._closed:
            return
        self.pipeline.guard(METRICS, self.pipeline.drain)
        self._closed = True
        self.pipeline.close()

    def __enter__(self) -> Introspector:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
