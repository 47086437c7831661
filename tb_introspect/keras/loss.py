"""What a Keras model's compiled loss is, for the ``loss`` metric's metadata.

The findings need to know whether the loss is a cross-entropy, whether it applies the
softmax itself (``from_logits``) and its label smoothing (docs/findings.md, ``loss_floor``).
Read from the loss object or function given to ``compile``, never from names: a loss
this module does not know (a custom function, several outputs) is recorded as unknown.
"""

from __future__ import annotations

from typing import Any

import keras

from tb_introspect import loss_field

_CLASSIFICATION = ("sparse_categorical_crossentropy", "categorical_crossentropy",
                   "binary_crossentropy", "binary_focal_crossentropy",
                   "categorical_focal_crossentropy")
_REGRESSION = ("mean_squared_error", "mean_absolute_error", "mean_absolute_percentage_error",
               "mean_squared_logarithmic_error", "huber", "log_cosh")


def _functions(names: tuple[str, ...]) -> set:
    return {f for n in names if (f := getattr(keras.losses, n, None)) is not None}


def describe(loss: Any) -> str:
    """``loss_field.loss_json`` of a compiled loss (a string, a function or a Loss object);
    "" when the loss is not one of Keras's cross-entropies or regression losses."""
    if isinstance(loss, str):
        try:
            loss = keras.losses.get(loss)
        except ValueError:
            return ""
    fn, kwargs = loss, {}
    if isinstance(loss, keras.losses.Loss) and callable(getattr(loss, "fn", None)):
        # Keras's Loss classes wrap the loss function with its keyword arguments.
        fn, kwargs = loss.fn, dict(getattr(loss, "_fn_kwargs", {}) or {})
    name = getattr(fn, "__name__", type(fn).__name__)
    if fn in _functions(_CLASSIFICATION):
        return loss_field.loss_json(
            "classification", from_logits=bool(kwargs.get("from_logits", False)),
            label_smoothing=float(kwargs.get("label_smoothing", 0.0) or 0.0), name=name)
    if fn in _functions(_REGRESSION):
        return loss_field.loss_json("regression", name=name)
    return ""


def describe_model(model: Any) -> str:
    """The description of ``model``'s compiled loss (one loss for one output), or ""."""
    loss = getattr(model, "loss", None)
    if isinstance(loss, (list, tuple)) and len(loss) == 1:
        loss = loss[0]
    if loss is None or isinstance(loss, (dict, list, tuple)):
        return ""
    text = describe(loss)
    info = loss_field.parse_loss(text) or {}
    if info.get("from_logits") and _keras_takes_the_logits(model):
        # Keras's softmax keeps its input on the TensorFlow tensor it returns, and the
        # cross-entropies take that as the logits even under from_logits=True (warning
        # about it): the loss then never sees probabilities.
        text = loss_field.loss_json("classification", from_logits=False,
                                  label_smoothing=info["label_smoothing"], name=info["name"])
    return text


def _keras_takes_the_logits(model: Any) -> bool:
    """Whether ``model``'s output is Keras's own softmax on the TensorFlow backend."""
    if keras.backend.backend() != "tensorflow" or not getattr(model, "layers", None):
        return False
    last = model.layers[-1]
    return (isinstance(last, keras.layers.Softmax)
            or getattr(last, "activation", None) is keras.activations.softmax)
