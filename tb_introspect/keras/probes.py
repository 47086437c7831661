"""The Keras side's transformer probes: a few extra numbers per layer, on statistics steps.

Per monitored layer output, the lower median of its finite |a| (of a sample of at most
``probe_window.SAMPLE_SIZE`` values of the batch) and the kurtosis m4 / m2**2 of all its values; per
``MultiHeadAttention`` layer, the largest |pre-softmax logit| at evenly spread query rows
against every key, the mask applied; for the output head (the last Dense layer of a
classifier or language model), its largest logit and the mean over rows of the logits'
logsumexp (``slots.PROBE_FIELDS``, ``docs/format.md``). The definitions, the window
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

from tb_introspect import loss_field
from tb_introspect.keras import capture, kernels, private
from tb_introspect.keras.model_parts import CapturedLayer
from tb_introspect.keras.probe_values import (
    attention_logit_max,
    head_logits,
    output_probes_fn,
    output_probes_many_fn,
)
from tb_introspect.pipeline import probe_window
from tb_introspect.pipeline.failures import Part
from tb_introspect.pipeline.plan import Plan, sanitize

VALUE_FIELDS = probe_window.VALUE_FIELDS
#: The averaged probes (a sum and a count each in the state), then the maxima.
MEANS = probe_window.MEANS
MAXIMA = probe_window.MAXIMA
_WIDTH = probe_window.WIDTH
#: Activations whose pre-activation is what the head's loss takes as logits.
_PROBABILITIES = frozenset({"softmax", "sigmoid", "log_softmax"})


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
                # the seed output_probes_fn takes for the group's first probed output
                first = seed + tf.constant([0, 7919 * (probed[0][1] + 1)], tf.int64)
                pairs = kernels.call(output_probes_many_fn(group.dtype), group.values,
                                     group.sizes, first)
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


def discover(captured: Sequence[CapturedLayer], order: Sequence[str],
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
        task = (loss_field.parse_loss(loss_info) or {}).get("task")
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
