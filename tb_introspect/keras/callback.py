"""``Introspect``: a Keras 3 callback that logs the four views from an unmodified ``fit``.

How it gets at what a callback normally cannot see:

* **gradients** — the optimizer's ``apply`` gets an instance-level wrapper that
  hands the gradients to the step recorder before applying them (works for the
  built-in train step, user ``train_step`` overrides, loss scaling);
* **layer outputs and output gradients** — the monitored layers' ``call`` gets
  a wrapper that routes outputs through a probe (``capture.py``);
* **per-step loss/metrics** — Keras' trackers are running means; the step
  records each ``Mean`` metric's change in total and count, so the exact
  per-step value is total/count even with ``steps_per_execution > 1``.

The instrumented step wraps whatever ``model.train_step`` is, so compile
settings, metrics, loss scaling, ``steps_per_execution``, ``jit_compile`` and
distribution strategies are the user's own. Nothing is written inside the
compiled step; the callback writes between executions.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import logging
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import keras
import tensorflow as tf

from tb_introspect import slots
from tb_introspect.keras import capture, private, probes
from tb_introspect.keras import loss as compiled_loss
from tb_introspect.keras.discovery import any_batch, batch_spec, discover_outputs
from tb_introspect.keras.front_end import KerasFrontEnd
from tb_introspect.keras.install import Installation, gradients_to_recorder
from tb_introspect.keras.model_parts import (
    is_rectifier,
    layers_to_capture,
    mean_metrics,
    variable_owners,
)
from tb_introspect.keras.workers import (
    is_chief,
    is_multi_worker,
    tf_config_tasks,
    warn_multi_worker,
)
from tb_introspect.pipeline.failures import METRICS, Part, warn
from tb_introspect.pipeline.governor import Governor, Phase
from tb_introspect.pipeline.options import (
    DEFAULT_OVERHEAD,
    OptionArgs,
    Options,
    check_log_dir,
)
from tb_introspect.pipeline.pipeline import Pipeline
from tb_introspect.pipeline.plan import sampled_between
from tb_introspect.pipeline.sink import EventSink

if TYPE_CHECKING:
    from typing_extensions import Unpack

_CONTROL_FLOW = (StopIteration, tf.errors.OutOfRangeError)
logger = logging.getLogger("tb_introspect")


_live: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _flush_all() -> None:  # a crash outside fit() still leaves readable event files
    for cb in list(_live):
        try:
            cb._flush()
        except Exception:
            pass


class Introspect(keras.callbacks.Callback):
    """Log per-layer statistics of weights, gradients, layer outputs and output gradients.

    Pass it to an unmodified ``model.fit``; open TensorBoard's Introspect tab on
    ``log_dir``. Statistics are computed in the training step (also under
    ``jit_compile=True`` and ``tf.distribute`` strategies) and written between
    steps; all replicas' data count; only the chief writes (``MirroredStrategy``:
    Keras 3's ``fit`` does not train under ``MultiWorkerMirroredStrategy``, where the
    callback gives one warning and stays off). Under
    ``jit_compile=True`` at most 48 layer outputs and output gradients are
    monitored (XLA's compile grows with each), evenly spread over the model.

    With ``every="epoch"`` an overhead governor keeps the added time within
    ``overhead`` of the plain step: the one instrumented train function computes the
    statistics of outputs and output gradients on each epoch's first step and then
    only as often as the budget allows (a device switch, set between executions); the
    other steps count the rectifier outputs' activity (exact dead rates), sum the
    gradients and record the metrics. Where those counts cost more than the budget's share
    of a step (timed once, a few steps without them), they are taken on the steps the
    budget pays and the activity is written as sampled. The cadence it reached is
    written with every point (the ``stats_steps`` / ``steps`` slots; the tab shows "1 step
    in N"). What the
    compiled loss is (a cross-entropy from logits or not, its label smoothing, a
    regression loss) is recorded with the loss metric, for the findings.

    Args:
        log_dir: run directory for the event files (created; must be writable), or a
            bucket URL (``s3://``, ``gs://``, any fsspec URL: see the README's Hosting).
        views: any of ``"variable"``, ``"gradient"``, ``"output"``, ``"output_gradient"``.
        every: ``"epoch"`` (aggregate each epoch: variables at its end,
            gradients summed over its steps, outputs merged over all its
            batches), or ``N`` (statistics of every N-th step). Per-step loss and
            metrics and their per-epoch bands are written in both cases.
        **options: what every front-end takes (``pipeline.options.OptionArgs``):
            ``sample_size``, ``step_sample_size``, ``stats_every``, ``layers``,
            ``rectifiers``, ``overhead``, ``quantiles``, ``flush_secs``, ``seed``,
            ``on_finding`` (``"stop"``: ``model.stop_training`` is set when a finding
            of at least ``on_finding_severity`` appears; or a callable ``f(finding)``).

    Example:
        >>> import keras, numpy as np, tempfile
        >>> from tb_introspect.keras import Introspect
        >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        >>> model.compile("sgd", "mse")
        >>> x, y = np.ones((8, 4), "float32"), np.zeros((8, 2), "float32")
        >>> _ = model.fit(x, y, epochs=1, verbose=0,
        ...               callbacks=[Introspect(tempfile.mkdtemp(), every=1)])
    """

    def __init__(self, log_dir: str, views: Sequence[str] = slots.VIEWS,
                 every: str | int = "epoch", **options: Unpack[OptionArgs]):
        super().__init__()
        self.options = Options.of(views, every, options)
        self.log_dir = check_log_dir(log_dir)
        self.writer: EventSink | None = None
        self.front_end: KerasFrontEnd | None = None
        self.pipeline: Pipeline | None = None
        self.installation: Installation | None = None
        _live.add(self)
        if tf_config_tasks() > 1:  # fit() fails before any callback hook under it
            warn_multi_worker()

    # ------------------------------------------------------------------ set-up

    def on_train_begin(self, logs: dict | None = None) -> None:
        if is_multi_worker(self.model.distribute_strategy):  # off: fit() is Keras' own
            warn_multi_worker()
            self.front_end = self.pipeline = None
            return
        try:
            if self._reusable():
                self._reinstall()
            else:
                self.front_end = self.pipeline = None
                self._setup()
        except Exception as e:
            warn(f"set-up failed ({type(e).__name__}: {e}); statistics are off for this"
                 " fit(), training goes on")
            self._uninstall(failed=True)

    def _setup(self) -> None:
        model = self.model
        self.strategy = model.distribute_strategy
        self.chief = is_chief(self.strategy)
        if self.chief and self.writer is None:
            self.writer = EventSink(self.log_dir, upload_secs=self.options.flush_secs)
        self.steps_per_execution = max(int(getattr(model, "steps_per_execution", 1) or 1), 1)
        every = self.options.every
        if every != "epoch" and every < self.steps_per_execution:
            warn(f"every={every} with steps_per_execution={self.steps_per_execution}: logging"
                 f" every {self.steps_per_execution} steps (one point per execution)")
            every = self.steps_per_execution
        loss_scaled = isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
        self.front_end = KerasFrontEnd(dataclasses.replace(self.options, every=every),
                                       strategy=self.strategy, loss_scaled=loss_scaled)
        lockstep = is_multi_worker(self.strategy)
        per_epoch = every == "epoch"
        # Workers must run the same train function at the same step (its collectives pair
        # up), so with several workers the cadence is the fixed one, not each one's clock.
        self.governor = Governor(self.options.overhead if per_epoch and not lockstep else None,
                                 self.options.stats_every if per_epoch else 1)
        self.pipeline = Pipeline(self.front_end, self.writer, lockstep=lockstep,
                                 governor=self.governor)
        try:  # what the loss is, for the findings; never worth failing the set-up for
            self.pipeline.ring.loss_info = compiled_loss.describe_model(model)
        except Exception:
            pass
        self._every_step_noted = False
        self._original_step = model.train_step
        self.installation = Installation(model)
        self.installation.keep_original()
        self._install_lazy()

    def _signature(self) -> tuple:
        """What the instrumented train function depends on."""
        model = self.model
        return (
            id(model), id(model.distribute_strategy), id(model.optimizer),
            max(int(getattr(model, "steps_per_execution", 1) or 1), 1),
            getattr(model, "jit_compile", None), getattr(model, "run_eagerly", None),
            tuple(id(v) for v in model.trainable_variables),
        )

    def _reusable(self) -> bool:
        """A later fit() of the same compiled model reuses the built instrumentation
        (no re-trace: `for ...: model.fit(epochs=1)` loops stay cheap)."""
        return (
            self.front_end is not None and self.front_end.built
            and getattr(self, "_built_signature", None) == self._signature()
        )

    def _reinstall(self) -> None:
        if self.chief and self.writer is None:
            self.writer = EventSink(self.log_dir, upload_secs=self.options.flush_secs)
            self.pipeline.set_sink(self.writer)
        installation = self.installation
        installation.keep_original()
        installation.patch(layers=self.options.wants_outputs, apply=self._gradients_wrapper())
        self.pipeline.start(self.front_end.current_step())
        installation.route(self._run)

    def _install_lazy(self) -> None:
        """Defer the real set-up to the first step: it needs the data's shapes."""
        original = self.installation.original_fn

        def first_call(iterator):
            try:
                self._build(iterator)
            except Exception as e:
                warn(f"instrumentation failed ({type(e).__name__}: {e}); statistics are off"
                     " for this fit(), training goes on")
                self._uninstall(failed=True)
                return original(iterator)
            return self._run(iterator)

        self.installation.route(first_call)

    def _build(self, iterator: Any) -> bool:
        model, front_end = self.model, self.front_end
        want_outputs = self.options.wants_outputs
        spec = batch_spec(iterator)
        private.symbolic_build(model, spec)  # the variables and metrics, now
        if not model.trainable_variables and (
            self.options.want("variable") or self.options.want("gradient")
        ):
            warn("the model has no trainable variables: the variable and gradient views"
                 " are empty")
        every_layer = layers_to_capture(model)
        owner = variable_owners(every_layer)
        chosen = self.options.layers
        self._captured = [e for e in every_layer if front_end.plan.chosen(e.name)]
        if chosen is not None and not self._captured:
            warn(f"layers={chosen!r} names none of the model's layers"
                 f" ({', '.join(e.name for e in every_layer[:8])}...): nothing is monitored")
        installation = self.installation
        installation.capture_layers(self._captured)
        discovery = None
        if want_outputs:
            installation.patch(layers=True, apply=None)
            try:
                x_spec, _, _ = keras.utils.unpack_x_y_sample_weight(spec)
                discovery = discover_outputs(model, tf.nest.map_structure(any_batch, x_spec))
            except Exception as e:
                discovery = None
                warn(f"layer outputs of {type(model).__name__} could not be traced"
                     f" ({type(e).__name__}: {e}); the output and output_gradient views"
                     " are off, variables and gradients go on")
            if discovery is not None and not discovery.specs:
                warn("no layer output could be captured; the output and output_gradient"
                     " views are off")
            if discovery is not None and discovery.skipped:
                warn(f"non-tensor outputs not monitored: {', '.join(discovery.skipped[:5])}")
        specs = discovery.specs if discovery else []
        # Depth: forward order of a layer's first output; layers never seen go last.
        order = {}
        for k, entry in enumerate(self._captured):
            first = discovery.first_index.get(entry.name) if discovery else None
            order[entry.name] = (0, first) if first is not None else (1, k)
        ranked = sorted(order, key=lambda n: order[n])
        depth_of = {name: d for d, name in enumerate(ranked)}
        by_name = {e.name: e.layer for e in self._captured}
        for s in specs:
            s.depth = depth_of.get(s.layer, len(ranked))
            layer = by_name.get(s.layer)
            s.exact = (layer is not None and is_rectifier(layer)) or (
                front_end.plan.named_rectifier(s.layer))
        front_end.set_outputs(specs)
        if self.options.probes and specs:
            self._find_probes(ranked)
        variables = list(model.trainable_variables)
        if chosen is not None:
            variables = [v for v in variables if id(v) in owner and owner[id(v)] in by_name]
        names = [getattr(v, "path", None) or v.name for v in variables]
        layers = [owner.get(id(v), model.name) for v in variables]
        front_end.set_variables(variables, names, layers,
                                [depth_of.get(n, len(ranked)) for n in layers])
        self._metrics = mean_metrics(model)
        initial = 0
        if installation.optimizer is not None:
            initial = int(installation.optimizer.iterations.numpy())
        front_end.build([m.name for m in self._metrics],
                        metric_rows=max(32, 2 * self.steps_per_execution + 2),
                        initial_step=initial)
        self.pipeline.start(initial)
        self._steps_done = initial
        installation.patch(layers=False, apply=self._gradients_wrapper())
        # One traced train function; the device switch picks its statistics or lean part
        # per execution (two traced variants cost a fresh process's first fit a second
        # trace and graph optimization of the whole model).
        train_function = self._make_train_function(Phase.SWITCHED)
        self._instrumented_fn = functools.partial(self._switched, train_function, True, True)
        self._lean_fn = functools.partial(self._switched, train_function, False, True)
        self._bare_fn = functools.partial(self._switched, train_function, False, False)
        installation.route(self._run)
        self._checked_trace = False
        self._built_signature = self._signature()
        return True

    def _switched(self, train_function: Any, statistics: bool, counting: bool,
                  iterator: Any) -> Any:
        """One execution of the train function, its statistics part on or off (and a lean
        one's rectifier counts)."""
        self.front_end.switch(statistics, counting)
        return train_function(iterator)

    def _find_probes(self, order: list[str]) -> None:
        """The attention layers and the head the probes read (``probes.py``), wrapped."""
        try:
            found = probes.discover(self._captured, order, self.pipeline.ring.loss_info)
            if found is not None:
                self.front_end.probe_rows = found.rows
                self.installation.layers = found.patch(self.installation.layers)
        except Exception as e:  # training and the views go on without them
            self.front_end.plan.failures.fail(Part("probes"), e)

    def _make_train_function(self, phase: Phase) -> Any:
        """Keras' train function around the instrumented step in ``phase`` (traced on its
        first call). The instance attribute is only needed while Keras makes the function:
        it binds the step then."""
        model = self.model
        private.set_instance_attr(model, "train_step",
                                  functools.partial(self._instrumented_step, phase=phase))
        try:
            model.make_train_function(force=True)
        finally:
            private.del_instance_attr(model, "train_step")
        return model.train_function

    def _gradients_wrapper(self) -> Any:
        opt = self.installation.optimizer
        if opt is None or not self.options.want("gradient"):
            return None
        return gradients_to_recorder(opt)

    def _loss_scale(self) -> tf.Tensor | None:
        opt = self.installation.optimizer
        if isinstance(opt, keras.optimizers.LossScaleOptimizer):
            return tf.convert_to_tensor(opt.dynamic_scale)
        return None

    def _instrumented_step(self, data: Any, phase: Phase = Phase.STATS) -> Any:
        """The user's train step, recorded (runs inside Keras' compiled step)."""
        rec = self.front_end.recorder(loss_scale=self._loss_scale(), anchor=data, phase=phase)
        before = [(m.total.value, m.count.value) for m in self._metrics]
        before = [(tf.identity(t), tf.identity(n)) for t, n in before]
        with capture.recording(rec):
            logs = self._original_step(data)
        if before:
            with tf.control_dependencies(tf.nest.flatten(logs)):
                after = [(tf.identity(m.total.value), tf.identity(m.count.value))
                         for m in self._metrics]
            rec.record_metrics(
                [a[0] - b[0] for a, b in zip(after, before, strict=True)],
                [a[1] - b[1] for a, b in zip(after, before, strict=True)],
            )
        rec.finish()
        return logs

    # ------------------------------------------------------------------ running

    def _run(self, iterator: Any) -> Any:
        """The installed train function: instrumented, falling back to the original."""
        try:
            logs = self.governor.run(self._instrumented_fn, self._lean_fn, iterator,
                                     steps=self.steps_per_execution,
                                     full=self._sampled_execution(), bare_fn=self._bare_fn)
        except _CONTROL_FLOW:
            raise
        except Exception as e:
            # Is it ours? The uninstrumented function decides: if it runs, the
            # instrumentation is switched off and training goes on.
            self._uninstall(failed=True)
            try:
                logs = self.installation.original_fn(iterator)
            except BaseException:
                self._flush()
                raise
            warn(f"the instrumented train step failed ({type(e).__name__}: {e}); statistics"
                 " are off for the rest of training, training goes on")
            return logs
        except BaseException:  # KeyboardInterrupt: keep what was logged
            self._flush()
            raise
        if not self._checked_trace and True in self.governor.compile_seconds:
            self._checked_trace = True  # after the first statistics step: probes traced
            self._check_trace()
        return logs

    def _sampled_execution(self) -> bool | None:
        """With ``every=N``: does the next execution hold a sampled step? (None: the
        governor decides, ``every="epoch"``)."""
        every = self.front_end.plan.every
        if every == "epoch":
            return None
        return sampled_between(self._steps_done, self.steps_per_execution, every)

    def _check_trace(self) -> None:
        """After the first statistics step: the outputs its backward pass reached are those
        of the output_gradient view."""
        outputs, states = self.front_end.plan.outputs, self.front_end.output_states
        reached = states.gradient_reached if states is not None else set()
        for j, s in enumerate(outputs):
            s.has_grad = j in reached
        if self.options.want("output_gradient") and outputs and not reached:
            warn("no gradient reaches any layer output (no trainable variables?); the"
                 " output_gradient view is off")

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        self._batch_begin = int(batch)

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if not self._collecting():
            return
        steps = max(int(batch) - getattr(self, "_batch_begin", int(batch)) + 1, 1)
        self._steps_done += steps
        running = None
        if logs and not self.pipeline.is_off(METRICS):
            tracked = set(self.front_end.metric_ring.names)
            running = {k: v for k, v in logs.items() if k not in tracked}
        self.pipeline.after_steps(steps, running or None)
        self._stop_on_finding()

    def _stop_on_finding(self) -> None:
        """``on_finding="stop"``: a finding appeared, Keras ends ``fit`` after this step."""
        if self.pipeline.take_stop() is not None:
            self.model.stop_training = True

    def _collecting(self) -> bool:
        return (
            self.pipeline is not None and self.front_end is not None and self.front_end.built
            and self.installation is not None and self.installation.active
        )

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        if self.pipeline is not None:
            self.pipeline.begin_epoch(epoch)
            self.governor.begin_window()

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if not self._collecting():
            return
        val = {k: v for k, v in (logs or {}).items() if k.startswith("val_")}
        self.pipeline.end_epoch(val)
        self._stop_on_finding()
        if self.options.every == 1 and not self._every_step_noted:
            line = self.governor.every_step_cost(DEFAULT_OVERHEAD)
            if line is not None:
                self._every_step_noted = True
                logger.warning(line)  # a note, one line: not a warning with a source line

    def on_train_end(self, logs: dict | None = None) -> None:
        try:
            if self._collecting():
                self.pipeline.guard(METRICS, self.pipeline.drain)
                self.pipeline.act(final=True)  # on_finding sees the last epoch too
        finally:
            self._uninstall()
            self._flush(now=True)  # what fit wrote is in the bucket when it returns

    def close(self) -> None:
        """Close the event file (it is also closed when the callback is deleted)."""
        self._flush()
        if self.pipeline is not None:
            self.pipeline.close()
        elif self.writer is not None:
            self.writer.close()
        self.writer = None

    def _uninstall(self, failed: bool = False) -> None:
        """Remove every patch and put the model's own train function back."""
        if failed:
            self._built_signature = None  # never reuse what failed
        if self.installation is not None:
            self.installation.remove()

    def _flush(self, now: bool = False) -> None:
        if self.pipeline is not None:
            self.pipeline.flush(now)
        elif self.writer is not None:
            try:
                self.writer.flush(now)
            except Exception:
                pass
