"""The Keras side's transformer probes: a few extra numbers per layer, on statistics steps.

Per monitored layer output, the lower median of its finite |a| (of a sample of at most
``MEDIAN_SAMPLE`` values of the batch) and the kurtosis m4 / m2**2 of all its values; per
``MultiHeadAttention`` layer, the largest |pre-softmax logit| at evenly spread query rows
against every key, the mask applied; for the output head (the last Dense layer of a
classifier or language model), its largest logit and the mean over rows of the logits'
logsumexp (``metadata.PROBE_FIELDS``, ``docs/format.md``). The definitions, the window
state and its reduction over replicas are the probes' contract, shared with PyTorch
(``pipeline/probe_window.py``).

They are computed where the statistics states are (``step.StepRecorder._fold_stats``), so
only on statistics steps and under the same ``tf.cond`` as they are: the wrappers here only
hand the tensors over (``ProbeStep``). The attention wrapper takes the kernel's own inputs
(``MultiHeadAttention._compute_attention``: the projected query and keys and the mask) and
recomputes the logits of the sampled rows, so it also sees the layers that run a fused
``dot_product_attention`` that never materialises them. The head's logits are its
pre-activation (its ``activation`` is wrapped), the logits even under a softmax.

``ProbeStates`` is the device state, in ``probe_window``'s layout: per row the window's sums
and counts of the averaged probes and the running maxima, one ON_READ variable each replica
writes alone; a logged point gathers every replica's copy, resets them and reduces them with
``probe_window.combine`` (``read``).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from tb_introspect import metadata
from tb_introspect.collect import capture, kernels, private
from tb_introspect.pipeline import probe_window
from tb_introspect.pipeline.failures import Part
from tb_introspect.pipeline.plan import Plan, sanitize
from tb_introspect.stats.numeric import to_float, uniform

VALUE_FIELDS = probe_window.VALUE_FIELDS
#: The averaged probes (a sum and a count each in the state), then the maxima.
MEANS = probe_window.MEANS
MAXIMA = probe_window.MAXIMA
_WIDTH = probe_window.WIDTH
MEDIAN_SAMPLE = probe_window.SAMPLE_SIZE
#: Query rows (positions) of a batch whose attention logits are recomputed: every row of a
#: sequence up to this length, else this many evenly spread (``probe_window.query_rows``).
QUERY_ROWS = probe_window.QUERY_ROWS
#: Activations whose pre-activation is what the head's loss takes as logits.
_PROBABILITIES = frozenset({"softmax", "sigmoid", "log_softmax"})


# ------------------------------------------------------------------ the in-graph numbers


def abs_median(x: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    """``probe_window.abs_median`` of |x| (float64), the lower median of the finite values:
    exact up to ``MEDIAN_SAMPLE`` values, else of that many drawn with replacement
    (``seed``: an int64 pair); NaN where none is finite."""
    flat = tf.reshape(x, [-1])
    n = tf.size(flat, out_type=tf.int64)
    # One fixed-size sample whatever the batch (a branch per size made XLA sort every
    # value): all the values of a small batch, padded, else a draw. Drawn before anything
    # else: the batch itself is read once, by the gather.
    slots = tf.range(MEDIAN_SAMPLE, dtype=tf.int64)
    drawn = tf.cast(uniform([MEDIAN_SAMPLE], seed, 0) * tf.cast(n, tf.float64), tf.int64)
    index = tf.minimum(tf.where(n <= MEDIAN_SAMPLE, slots, drawn), tf.maximum(n - 1, 0))
    sample = tf.cond(n > 0, lambda: tf.gather(flat, index),
                     lambda: tf.zeros([MEDIAN_SAMPLE], flat.dtype))
    sample = tf.abs(to_float(sample))
    kept = (slots < tf.minimum(n, MEDIAN_SAMPLE)) & tf.math.is_finite(sample)
    inf = tf.constant(np.inf, sample.dtype)  # the padding and non-finite values: last
    ordered = tf.sort(tf.where(kept, sample, inf))
    m = tf.reduce_sum(tf.cast(kept, tf.int64))  # the finite values of the sample
    lower = tf.gather(ordered, tf.maximum(m - 1, 0) // 2)
    return tf.where(m > 0, tf.cast(lower, tf.float64), np.nan)


def kurtosis(x: tf.Tensor) -> tf.Tensor:
    """m4 / m2**2 of every value of ``x`` (central moments; 3 for a Gaussian), float64; NaN
    for a constant tensor or one with non-finite values."""
    flat = tf.reshape(to_float(x), [-1])
    d = flat - tf.reduce_mean(flat)
    m2 = tf.reduce_mean(tf.square(d))
    # Standardised first: d**4 would overflow float32 from |d| ~ 1e9.
    z = d * tf.math.rsqrt(m2)
    return tf.cast(tf.reduce_mean(tf.square(tf.square(z))), tf.float64)


def head_logits(logits: tf.Tensor) -> tf.Tensor:
    """[largest logit, mean over rows of logsumexp over the last axis] (float64)."""
    z = to_float(logits)
    z = tf.reshape(z, [-1, tf.shape(z)[-1]])
    return tf.cast(tf.stack([tf.reduce_max(z), tf.reduce_mean(tf.reduce_logsumexp(z, -1))]),
                   tf.float64)


def attention_logit_max(query: tf.Tensor, key: tf.Tensor, mask: tf.Tensor | None,
                        causal: bool, scale: float) -> tf.Tensor:
    """``probe_window.attention_logit_max``: the largest |q . k * scale| of ``query``
    ``[B, T, N, H]`` against ``key`` ``[B, S, N, H]``, over the heads, every key, the query
    rows ``probe_window.query_rows`` picks (all of a sequence up to ``QUERY_ROWS``, else
    that many evenly spread) and the first ``probe_window.batch_elements`` batch elements,
    the positions ``mask`` (broadcastable to ``[B, T, S]``, true: attend) and the causal
    mask leave out excluded (float64)."""
    q = to_float(query) * scale
    k = to_float(key)
    t_static = q.shape[1]
    if t_static is not None:
        rows = tf.constant(probe_window.query_rows(t_static), tf.int64)
    else:  # a traced length: the same integer rule
        t = tf.shape(q, out_type=tf.int64)[1]
        n = tf.minimum(t, QUERY_ROWS)
        rows = tf.range(n) * (t - 1) // tf.maximum(n - 1, 1)
    heads, keys = q.shape[2], k.shape[1]
    if heads is not None and keys is not None and t_static is not None:
        b = probe_window.batch_elements(heads * min(t_static, QUERY_ROWS) * keys)
    else:
        shape_q, shape_k = tf.shape(q, out_type=tf.int64), tf.shape(k, out_type=tf.int64)
        per = shape_q[2] * tf.size(rows, out_type=tf.int64) * shape_k[1]
        b = tf.maximum(tf.constant(1, tf.int64),
                       probe_window.LOGIT_BUDGET // tf.maximum(per, 1))
    q, k = q[:b], k[:b]
    q = tf.gather(q, rows, axis=1)
    scores = tf.abs(tf.einsum("brnh,bsnh->bnrs", q, k))  # [B, N, rows, S]
    keep = None
    if mask is not None:
        m = tf.cast(mask, tf.bool)
        while m.shape.rank < 3:
            m = m[tf.newaxis]
        m = m[:b]  # the kept batch elements (a mask of one broadcasts)
        if m.shape[1] != 1:  # a mask per query row: the sampled rows'
            m = tf.gather(m, rows, axis=1)
        keep = m[:, tf.newaxis]  # broadcasts against [B, N, rows, S]
    if causal:
        s = tf.shape(scores, out_type=tf.int64)[3]
        below = rows[:, tf.newaxis] >= tf.range(s)[tf.newaxis, :]  # Keras's causal mask
        keep = below if keep is None else tf.logical_and(keep, below)
    if keep is not None:
        scores = tf.where(keep, scores, tf.zeros_like(scores))
    return tf.cast(tf.reduce_max(scores), tf.float64)


@functools.cache
def output_probes_fn(rank: int, dtype: str, xla: bool) -> Callable:
    """``(x, seed) -> [abs_median, kurtosis]`` of one layer output, one nested function per
    rank and dtype (``kernels.py``: a graph per tensor would make a large model's trace
    long)."""

    @tf.function(
        input_signature=[tf.TensorSpec([None] * rank, tf.as_dtype(dtype)),
                         tf.TensorSpec([2], tf.int64)],
        autograph=False, jit_compile=True if xla else None,
        experimental_attributes=None if xla else {"_noinline": True},
    )
    def output_probes(x, seed):
        return tf.stack([abs_median(x, seed), kurtosis(x)])

    return output_probes


@functools.cache
def output_probes_many_fn(dtype: str) -> Callable:
    """``(values, sizes, seeds) -> [N, 2]``: ``output_probes_fn``'s numbers of each tensor
    of a ``kernels.Segments`` (flattened: the same values in the same order), one loop in
    one nested function (one call site per group: ``kernels.Segments``)."""

    @tf.function(
        input_signature=[tf.TensorSpec([None], tf.as_dtype(dtype)),
                         tf.TensorSpec([None], tf.int64), tf.TensorSpec([None, 2], tf.int64)],
        autograph=False, experimental_attributes={"_noinline": True},
    )
    def output_probes(values, sizes, seeds):
        def one(i):
            x = kernels.segment(values, sizes, i)
            return tf.stack([abs_median(x, seeds[i]), kurtosis(x)])

        return tf.map_fn(one, tf.range(tf.size(sizes, out_type=tf.int64)),
                         fn_output_signature=tf.TensorSpec([2], tf.float64))

    return output_probes


# ------------------------------------------------------------------ the device state


class ProbeStates:
    """The window's probes of every row on each replica: ``[rows, 8]`` float64, per row the
    sum and the count of each of ``MEANS``, then the running maximum of each of ``MAXIMA``
    (-inf: none yet). Create it under the strategy's scope."""

    def __init__(self, rows: Sequence[str], strategy: tf.distribute.Strategy):
        self.rows = list(rows)
        self.index = {name: i for i, name in enumerate(self.rows)}
        self.strategy = strategy
        self.empty = probe_window.empty(len(self.rows))
        self.state = tf.Variable(self.empty, dtype=tf.float64, trainable=False,
                                 name="probes",
                                 synchronization=tf.VariableSynchronization.ON_READ,
                                 aggregation=tf.VariableAggregation.NONE)
        self._read: Callable | None = None

    def update(self, values: dict[str, list[tuple[list[int], tf.Tensor]]]) -> tf.Tensor:
        """One step's ``[rows, 8]`` update from ``{probe: [(rows, float64 [len(rows)])]}``:
        a finite averaged value adds itself and a count of one, a maximum its value. A few
        ops per probe, not per row (a model's every layer output has a row)."""
        n = len(self.rows)
        columns = []
        for name in MEANS + MAXIMA:
            pieces = values.get(name, [])
            if pieces:
                index = tf.constant([[i] for rows, _ in pieces for i in rows], tf.int32)
                got = tf.concat([tf.reshape(tf.cast(v, tf.float64), [-1])
                                 for _, v in pieces], 0)
                present = tf.scatter_nd(index, tf.ones_like(got), [n]) > 0
                dense = tf.scatter_nd(index, got, [n])
            else:
                present, dense = tf.zeros([n], tf.bool), tf.zeros([n], tf.float64)
            if name in MEANS:
                ok = present & tf.math.is_finite(dense)
                columns += [tf.where(ok, dense, 0.0), tf.cast(ok, tf.float64)]
            else:
                columns.append(tf.where(present, dense, -np.inf))
        return tf.stack(columns, axis=1)

    def fold(self, update: tf.Tensor) -> None:
        """Add a step's ``update`` to this replica's state, as ``probe_window.fold`` does
        (a NaN maximum stays NaN, +inf is kept)."""
        old = self.state.read_value()
        split = probe_window.MAXIMA_AT
        a, b = old[:, split:], update[:, split:]
        highest = tf.where(tf.math.is_nan(a) | tf.math.is_nan(b),
                           tf.constant(np.nan, tf.float64), tf.maximum(a, b))
        self.state.assign(tf.concat([old[:, :split] + update[:, :split], highest], 1))

    def read(self) -> dict[str, np.ndarray]:
        """The window's probes, row name -> ``VALUE_FIELDS`` values (NaN: none), of every
        replica's state (gathered in replica context, as the output states are:
        ``point_graph.gather_outputs``), reduced by ``probe_window.combine``; the state
        starts again."""
        if self._read is None:
            empty = tf.constant(self.empty)

            def take():
                value = self.state.read_value()
                context = tf.distribute.get_replica_context()
                if context is not None and context.num_replicas_in_sync > 1:
                    states = context.all_gather(value[tf.newaxis], axis=0)  # [R, rows, W]
                else:
                    states = value[tf.newaxis]
                with tf.control_dependencies([states]):
                    self.state.assign(empty)
                return tf.identity(states)

            self._read = tf.function(lambda: self.strategy.run(take), autograph=False)
        with self.strategy.scope(), private.without_graph_optimization():
            result = self._read()
        states = np.asarray(self.strategy.experimental_local_results(result)[0])
        return probe_window.combine(states, self.rows)


# ------------------------------------------------------------------ in one traced step


class ProbeStep:
    """What one traced statistics step hands over to the probes: the attention layers'
    kernel inputs and the head's logits (the layer outputs come from the recorder's stash);
    ``fold`` computes and accumulates them."""

    def __init__(self, states: ProbeStates, plan: Plan):
        self.states = states
        self.failures = plan.failures
        #: output index -> probe row
        self.output_rows = {j: states.index[s.name] for j, s in enumerate(plan.outputs)
                            if s.name in states.index}
        self.attention_inputs: dict[int, tuple] = {}
        self.logits: dict[int, tf.Tensor] = {}
        self.calls: dict[str, int] = {}

    def _row(self, kind: str, name: str) -> int | None:
        count = self.calls.get(f"{kind}:{name}", 0)
        self.calls[f"{kind}:{name}"] = count + 1
        if count:  # a layer called again in the step: its first call counts
            return None
        return self.states.index.get(sanitize(name))

    def attention(self, name: str, query: Any, key: Any, mask: Any, causal: bool,
                  scale: float) -> None:
        row = self._row("attention", name)
        if row is not None and not self.failures.is_off("probes", name):
            self.attention_inputs[row] = (query, key, mask, bool(causal), float(scale))

    def head(self, name: str, logits: Any) -> None:
        row = self._row("head", name)
        if row is not None and not self.failures.is_off("probes", name):
            self.logits[row] = logits

    def fold(self, outputs: dict[int, tf.Tensor], seed: tf.Tensor, xla: bool,
             segments: Sequence[kernels.Segments] | None = None) -> None:
        """Compute this step's probes (layer ``outputs`` by output index; ``seed`` an int64
        pair) and fold them into the state; a probe that fails is switched off alone.
        ``segments``: the same outputs grouped for one call per group (outside XLA)."""
        values: dict[str, list[tuple[list[int], tf.Tensor]]] = {}
        rows = self.states.rows

        def add(name: str, at: list[int], v: tf.Tensor) -> None:
            values.setdefault(name, []).append((at, v))

        for group in segments or []:
            probed = [(n, self.output_rows[j]) for n, j in enumerate(group.rows)
                      if j in self.output_rows
                      and not self.failures.is_off("probes", rows[self.output_rows[j]])]
            if not probed:
                continue
            try:
                # each output's own seed, as output_probes_fn's: seed + [0, 7919 (i + 1)]
                seeds = seed[tf.newaxis] + tf.constant(
                    [[0, 7919 * (self.output_rows[j] + 1) if j in self.output_rows else 0]
                     for j in group.rows], tf.int64)
                pairs = kernels.call(output_probes_many_fn(group.dtype), group.values,
                                     group.sizes, seeds)
                pick = tf.constant([n for n, _ in probed], tf.int32)
                at = [i for _, i in probed]
                add("abs_median", at, tf.gather(pairs[:, 0], pick))
                add("kurtosis", at, tf.gather(pairs[:, 1], pick))
            except Exception as e:
                for _, i in probed:
                    self.failures.fail(Part("probes", rows[i]), e)
        for j, t in ({} if segments is not None else outputs).items():
            i = self.output_rows.get(j)
            if i is None or self.failures.is_off("probes", rows[i]):
                continue
            try:
                fn = output_probes_fn(t.shape.rank, t.dtype.name, xla)
                pair = fn(t, seed + tf.constant([0, 7919 * (i + 1)], tf.int64))
                add("abs_median", [i], pair[0])
                add("kurtosis", [i], pair[1])
            except Exception as e:
                self.failures.fail(Part("probes", rows[i]), e)
        for i, (q, k, mask, causal, scale) in self.attention_inputs.items():
            try:
                add("attn_logit_max", [i], attention_logit_max(q, k, mask, causal, scale))
            except Exception as e:
                self.failures.fail(Part("probes", rows[i]), e)
        for i, z in self.logits.items():
            try:
                pair = head_logits(z)
                add("logit_max", [i], pair[0])
                add("logit_lse", [i], pair[1])
            except Exception as e:
                self.failures.fail(Part("probes", rows[i]), e)
        if values:
            try:
                self.states.fold(self.states.update(values))
            except Exception as e:
                self.failures.fail(Part("probes"), e)


# ------------------------------------------------------------------ which layers, wrapped


def _activation_name(layer: Any) -> str:
    act = getattr(layer, "activation", None)
    return act if isinstance(act, str) else getattr(act, "__name__", "")


def _is_softmax(layer: Any) -> bool:
    return isinstance(layer, keras.layers.Softmax) or (
        isinstance(layer, keras.layers.Activation) and _activation_name(layer) == "softmax")


class ProbeLayers:
    """The attention layers and the output head of a model, and the rows they make."""

    def __init__(self, attention: list[tuple[Any, str]], head: tuple[Any, str] | None):
        self.attention = attention
        self.head = head

    @property
    def rows(self) -> list[str]:
        """The attention layers' and the head's rows (sanitized names)."""
        names = [name for _, name in self.attention] + ([self.head[1]] if self.head else [])
        return list(dict.fromkeys(sanitize(n) for n in names))

    def patch(self, layers: Any) -> ProbePatches:
        """Wrap the attention steps and the head's activation now; the result installs and
        removes them with ``layers`` (a ``capture.LayerPatcher``, already installed)."""
        patches = ProbePatches(layers, self)
        patches.install_probes()
        return patches


def discover(captured: Sequence[capture.CapturedLayer], order: Sequence[str],
             loss_info: str = "") -> ProbeLayers | None:
    """The probed layers among the monitored ones (``order``: their names in forward order):
    every ``MultiHeadAttention`` (nested in a composite layer too) and the head, the last
    layer with weights when it is a ``Dense``/``EinsumDense`` of a classifier (a
    cross-entropy loss, a softmax or sigmoid on it or after it). None: neither."""
    attention = attention_layers([(e.layer, e.name) for e in captured])
    by_name = {e.name: e.layer for e in captured}
    ordered = [by_name[n] for n in order if n in by_name]
    names = {id(layer): n for n, layer in by_name.items()}
    weighted = [i for i, layer in enumerate(ordered) if layer.trainable_variables]
    head = None
    if weighted:
        last = ordered[weighted[-1]]
        dense = isinstance(last, (keras.layers.Dense, keras.layers.EinsumDense))
        probabilities = _activation_name(last) in _PROBABILITIES or any(
            _is_softmax(layer) for layer in ordered[weighted[-1] + 1:])
        task = (metadata.parse_loss(loss_info) or {}).get("task")
        if dense and (task == "classification" or probabilities):
            head = (last, names[id(last)])
    if not attention and head is None:
        return None
    return ProbeLayers(attention, head)


def attention_layers(roots: Sequence[tuple[Any, str]]) -> list[tuple[Any, str]]:
    """Every ``MultiHeadAttention`` among the (layer, name) ``roots`` and the layers nested
    in them, named by their path from the root (``block/mha``)."""
    found: list[tuple[Any, str]] = []
    seen: set[int] = set()

    def walk(layer: Any, name: str) -> None:
        if id(layer) in seen:
            return
        seen.add(id(layer))
        if private.attention_kernel(layer) is not None:
            found.append((layer, name))
            return
        for sub in private.sublayers(layer):
            walk(sub, f"{name}/{sub.name}")

    for layer, name in roots:
        walk(layer, name)
    return found


def model_attention(model: Any) -> ProbeLayers | None:
    """A model's attention layers (the custom loop's ``Introspector(model=...)``), or None."""
    found = attention_layers([(sub, sub.name) for sub in private.sublayers(model)])
    return ProbeLayers(found, None) if found else None


#: The custom loop's attention inputs, per thread (a replica's step runs in its own),
#: from the forward pass until ``record`` takes them (``take_held``).
_held = threading.local()


def _graph() -> Any:
    return None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()


def take_held(step: ProbeStep | None) -> None:
    """Hand the attention inputs held since the last call to ``step``: those of the forward
    pass traced in the same function as this call (the training step's)."""
    held, _held.inputs = getattr(_held, "inputs", {}), {}
    graph = _graph()
    for name, (where, args) in held.items():
        if step is not None and where is graph:
            step.attention(name, *args)


def _active_step() -> ProbeStep | None:
    return getattr(capture.active_recorder(), "probe_step", None)


def _wrap_attention(kernel: Callable, layer: Any, name: str, hold: bool) -> Callable:
    scale = 1.0 / float(np.sqrt(float(layer.key_dim)))

    @functools.wraps(kernel)
    def probed(query, key, value, attention_mask=None, *args, **kwargs):
        step = _active_step()
        if (step is not None or hold) and getattr(query, "shape", None) is not None and (
                query.shape.rank == 4):
            inputs = (query, key, attention_mask,
                      bool(kwargs.get("use_causal_mask", False)), scale)
            if step is None:  # the custom loop: ``record`` comes after the forward pass
                held = getattr(_held, "inputs", None)
                if held is None:
                    held = _held.inputs = {}
                held[name] = (_graph(), inputs)
            else:
                try:
                    step.attention(name, *inputs)
                except Exception as e:  # the layer computes as before
                    step.failures.fail(Part("probes", name), e)
        return kernel(query, key, value, attention_mask, *args, **kwargs)

    return probed


def _wrap_head(activation: Callable, name: str) -> Callable:
    # functools.wraps: a model saved during fit() serializes the activation as its own.
    @functools.wraps(activation)
    def probed(x, *args, **kwargs):
        step = _active_step()
        if step is not None:
            step.head(name, x)
        return activation(x, *args, **kwargs)

    return probed


class ProbePatches:
    """The capture wrappers (``capture.LayerPatcher``) and the probes' own, installed and
    removed together (the callback's ``Installation`` holds this in their place): the
    attention layers' step and the head's ``activation``, as instance attributes."""

    def __init__(self, layers: Any, probed: ProbeLayers, hold: bool = False):
        self.layers = layers  # None: the probes' wrappers only
        self.probed = probed
        self.hold = hold  # hold the attention inputs for ``record`` (``take_held``)
        self._saved: list[tuple[Any, str, bool, Any]] = []

    def install(self) -> None:
        if self.layers is not None:
            self.layers.install()
        self.install_probes()

    def install_probes(self) -> None:
        if self._saved:
            return
        for layer, name in self.probed.attention:
            kernel = private.attention_kernel(layer)
            if kernel is not None:
                self._set(layer, private.ATTENTION_KERNEL,
                          _wrap_attention(kernel, layer, name, self.hold))
        if self.probed.head is not None:
            layer, name = self.probed.head
            if callable(getattr(layer, "activation", None)):
                self._set(layer, "activation", _wrap_head(layer.activation, name))

    def _set(self, layer: Any, attr: str, value: Any) -> None:
        self._saved.append((layer, attr, attr in layer.__dict__, layer.__dict__.get(attr)))
        private.set_instance_attr(layer, attr, value)

    def remove(self) -> None:
        while self._saved:
            layer, attr, had_own, previous = self._saved.pop()
            if had_own:
                private.set_instance_attr(layer, attr, previous)
            else:
                private.del_instance_attr(layer, attr)
        if self.layers is not None:
            self.layers.remove()
