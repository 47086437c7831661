"""``Introspector``: the four views for custom ``GradientTape`` training loops.

The user hands over what a Keras callback has to dig out: variables and their
gradients, optionally layer outputs and output gradients, and per-step scalars
(loss, metrics). ``record`` runs inside the user's (possibly XLA-compiled)
step and only updates accumulators; ``step`` / ``end_epoch`` write
summaries from the host, with the same statistics, cadences and per-epoch
aggregation as the Keras callback.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import tensorflow as tf

from tb_introspect import slots
from tb_introspect.keras import probes
from tb_introspect.keras.front_end import KerasFrontEnd
from tb_introspect.keras.workers import is_chief
from tb_introspect.pipeline.failures import METRICS, warn
from tb_introspect.pipeline.options import (
    OptionArgs,
    Options,
    check_log_dir,
)
from tb_introspect.pipeline.pipeline import Pipeline
from tb_introspect.pipeline.plan import Monitored, sanitize
from tb_introspect.pipeline.sink import EventSink

if TYPE_CHECKING:
    from typing_extensions import Unpack


def _variable_name(v: Any) -> str:
    name = getattr(v, "path", None) or v.name
    return name[:-2] if name.endswith(":0") else name


class Introspector:
    """Per-layer statistics for a custom training loop, written to ``log_dir``.

    Call ``record(...)`` once per training step (inside or outside
    ``tf.function``, also with ``jit_compile=True``), ``step()`` after each
    step and ``end_epoch()`` after each epoch, from Python; ``close()`` at the
    end (or use it as a context manager). ``every`` is ``"epoch"`` (gradients
    summed over the epoch, outputs merged over all its batches, variables at its
    end) or ``N`` (statistics of every N-th step). The keyword arguments are
    those of ``tb_introspect.keras.Introspect`` but ``overhead`` (the statistics
    steps are chosen in the graph: the first of each epoch, every
    ``stats_every``-th, the non-finite ones of ``pipeline.governor.Phase``).
    ``layers`` and ``rectifiers`` match the names given to ``record``; the activity
    of every recorded output is counted on every step (exact dead rates) unless
    ``rectifiers`` names the ones to count so, the others then counting on the
    statistics steps only.
    With ``on_finding="stop"``, ``step()`` / ``end_epoch()`` raise
    ``tb_introspect.FindingStop`` once a finding appears, after its point is written.
    The transformer probes (``keras/probes.py``) come from the statistics steps: with
    ``model``, its ``MultiHeadAttention`` layers' largest logits (the forward pass's,
    taken by the next ``record`` traced in the same function), and with ``record``'s
    ``head``, that output's logits; with either, the recorded outputs' median |a| and
    kurtosis too.

    Example:
        >>> import tempfile, keras, tensorflow as tf
        >>> from tb_introspect.keras import Introspector
        >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        >>> opt = keras.optimizers.SGD(0.1)
        >>> intro = Introspector(tempfile.mkdtemp(), every=1)
        >>> @tf.function
        ... def train_step(x, y):
        ...     with tf.GradientTape() as tape:
        ...         loss = tf.reduce_mean((model(x) - y) ** 2)
        ...     grads = tape.gradient(loss, model.trainable_variables)
        ...     opt.apply_gradients(zip(grads, model.trainable_variables))
        ...     intro.record(variables=model.trainable_variables, gradients=grads,
        ...                  metrics={"loss": loss})
        >>> for step in range(3):
        ...     train_step(tf.ones((8, 4)), tf.zeros((8, 2)))
        ...     intro.step()
        >>> intro.end_epoch()
        >>> intro.close()
    """

    def __init__(self, log_dir: str, views: Sequence[str] = slots.VIEWS,
                 every: str | int = "epoch", *, initial_step: int = 0,
                 initial_epoch: int = 0, model: Any = None, **options: Unpack[OptionArgs]):
        if options.get("overhead") is not None:
            raise TypeError("overhead= paces the Keras callback's and the PyTorch"
                            " Introspector's statistics steps; a custom loop's statistics"
                            " steps are decided in its compiled step, every stats_every-th")
        options = Options.of(views, every, {**options, "overhead": None})
        self.log_dir = check_log_dir(log_dir)
        strategy = tf.distribute.get_strategy()
        self.writer = (EventSink(self.log_dir, upload_secs=options.flush_secs)
                       if is_chief(strategy) else None)
        self.front_end = KerasFrontEnd(options, strategy=strategy)
        self.pipeline = Pipeline(self.front_end, self.writer)
        self.pipeline.begin_epoch(initial_epoch)
        self.initial_step = int(initial_step)
        self._broken = False
        self._names: tuple | None = None
        self._probe_patches: probes.ProbePatches | None = None
        found = probes.model_attention(model) if model is not None and options.probes else None
        if found is not None:  # wrapped until close()
            self._probe_patches = probes.ProbePatches(None, found, hold=True)
            self._probe_patches.install()

    # ------------------------------------------------------------------ in the step

    def record(
        self,
        *,
        variables: Sequence[Any] = (),
        gradients: Sequence[Any] = (),
        outputs: Mapping[str, Any] | None = None,
        output_gradients: Mapping[str, Any] | None = None,
        metrics: Mapping[str, Any] | None = None,
        head: str | None = None,
    ) -> None:
        """Record one training step (call it in the step, after the gradients).

        ``variables`` and ``gradients`` are aligned lists (None gradients are
        skipped); ``outputs`` / ``output_gradients`` map a layer name to its
        output and to the gradient of the loss with respect to it (e.g.
        ``tape.gradient(loss, [vars, outs])``); ``metrics`` maps names to scalars;
        ``head`` names the output that holds the model's logits (before any softmax).
        The set of tensors must be the same at every call.
        """
        if self._broken:
            return
        outputs = dict(outputs or {})
        output_gradients = dict(output_gradients or {})
        metrics = dict(metrics or {})
        try:
            if not self.front_end.built:
                with tf.init_scope():
                    self._build(list(variables), outputs, output_gradients, metrics, head)
            rec = self.front_end.recorder(anchor=[list(gradients), list(outputs.values()),
                                                  list(metrics.values())])
            if len(gradients) != len(variables):
                raise ValueError(
                    f"{len(variables)} variables but {len(gradients)} gradients"
                )
            rec.gradients(list(gradients), list(variables))
            probes.take_held(rec.probe_step)
            if rec.probe_step is not None and head in outputs:
                rec.probe_step.head(head, tf.convert_to_tensor(outputs[head]))
            for name, x in outputs.items():
                j = rec.output_index(name)
                if j is not None and x is not None:
                    rec.output_value(j, tf.convert_to_tensor(x))
            for name, dy in output_gradients.items():
                j = rec.output_index(name)
                if j is not None and dy is not None:
                    rec.output_gradient(j, tf.convert_to_tensor(dy))
            names = self.front_end.metric_ring.names
            if names:
                values = [tf.reshape(tf.cast(metrics[n], tf.float64), [])
                          if n in metrics else tf.constant(0.0, tf.float64) for n in names]
                counts = [tf.constant(1.0 if n in metrics else 0.0, tf.float64) for n in names]
                rec.record_metrics(values, counts)
            rec.finish()
        except Exception as e:  # never break training
            self._broken = True
            warn(f"Introspector.record failed ({type(e).__name__}: {e}); statistics are off,"
                 " training goes on")

    def _build(
        self,
        variables: list[Any],
        outputs: dict[str, Any],
        output_gradients: dict[str, Any],
        metrics: dict[str, Any],
        head: str | None = None,
    ) -> None:
        front_end = self.front_end
        plan = front_end.plan
        chosen = plan.options.layers
        names = [n for n in list(outputs) + [n for n in output_gradients if n not in outputs]
                 if plan.chosen(n)]
        specs = []
        for depth, name in enumerate(names):
            t = outputs.get(name)
            if t is None:
                t = output_gradients[name]
            t = tf.convert_to_tensor(t) if not isinstance(t, tf.Tensor) else t
            shape = t.shape.as_list() if t.shape.rank is not None else []
            specs.append(Monitored(
                view="output", name=sanitize(name), layer=name, depth=depth,
                shape=tuple(shape), dtype=t.dtype.name, has_grad=name in output_gradients,
                # The outputs of a custom loop are the user's choice: all exact unless
                # ``rectifiers`` says which are.
                exact=plan.options.rectifiers is None or plan.named_rectifier(name),
            ))
        front_end.set_outputs(specs)
        depth_of = {name: d for d, name in enumerate(names)}
        variable_names = [_variable_name(v) for v in variables]
        layers = [n.rsplit("/", 1)[0] if "/" in n else n for n in variable_names]
        if chosen is not None:
            keep = [i for i, layer in enumerate(layers) if plan.chosen(layer)]
            variables = [variables[i] for i in keep]
            variable_names, layers = [variable_names[i] for i in keep], [layers[i] for i in keep]
        for layer in layers:
            depth_of.setdefault(layer, len(depth_of))
        front_end.set_variables(variables, variable_names, layers, [depth_of[n] for n in layers])
        if self._probe_patches is not None:
            front_end.probe_rows = self._probe_patches.probed.rows
        if head is not None and head in outputs and plan.chosen(head):
            front_end.probe_rows = [*front_end.probe_rows, sanitize(head)]
        front_end.build(list(metrics), metric_rows=32, initial_step=self.initial_step)
        self.pipeline.start(self.initial_step)

    # ------------------------------------------------------------------ host side

    def step(self) -> None:
        """After each training step (from Python): writes what is due."""
        if self.front_end.built and not self._broken:
            self.pipeline.after_steps(1)
            self.pipeline.raise_stop()  # on_finding="stop": FindingStop, the point written

    def end_epoch(self) -> None:
        """After each epoch (from Python): per-epoch statistics and metric bands."""
        if self.front_end.built and not self._broken:
            self.pipeline.end_epoch()
        self.pipeline.begin_epoch(self.pipeline.epoch + 1)
        self.pipeline.raise_stop()

    def flush(self) -> None:
        self.pipeline.flush()

    def close(self) -> None:
        """Write what is pending and close the event file."""
        if self.front_end.built and not self._broken:
            self.pipeline.guard(METRICS, self.pipeline.drain)
        self.pipeline.close()
        self.writer = None
        if self._probe_patches is not None:
            self._probe_patches.remove()
            self._probe_patches = None

    def __enter__(self) -> Introspector:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
