"""The tab's texts (view and slot labels, formulas, chart texts) and ``schema()``.

``schema()`` joins them with the format's names from :mod:`tb_introspect.metadata` into one
JSON-able dict. The frontend holds no copy of these names and texts: it imports them from
``frontend/src/schema.js``, generated from ``schema()`` by ``python -m tb_introspect.schema_js``
(``tests/format/test_schema.py`` fails when it is stale). Shared by both sides like ``metadata``,
so it must never import TensorFlow.
"""

from __future__ import annotations

from tb_introspect.metadata import CADENCES, PLUGIN_NAME, PROTO_VERSION, TAG_PREFIX
from tb_introspect.slots import (
    ACTIVITY_FIELDS,
    BASE_FIELDS,
    DEFAULT_QUANTILES,
    ILR_PREFIX,
    METRIC_EPOCH_BAND_FIELDS,
    METRIC_EPOCH_FIELDS,
    METRIC_FIELDS,
    NONFINITE_FIELDS,
    PROBE_FIELDS,
    PROBE_VALUE_FIELDS,
    VIEW_EXTRA_FIELDS,
    VIEWS,
    WINDOW_STEP_FIELDS,
    quantile_field,
)

#: The findings' severities, most severe first.
SEVERITIES = ("critical", "warning", "info")
#: Reference thresholds the tab draws and the findings use: an attention logit past
#: Megatron-LM's ``--qk-clip-threshold`` (100), the kurtosis of a Gaussian (3, a layer
#: output at initialisation), a massive activation (|a| > 100 and > 1000 times the layer
#: output's median |a|).
PROBE_REFERENCES: dict[str, float] = {
    "attn_logit_max": 100.0, "kurtosis": 3.0, "massive_abs": 100.0, "massive_ratio": 1000.0,
}

#: Each formula the tab prints, defined once; the chart texts below quote them.
FORMULAS: dict[str, str] = {
    "rms": "L2 norm / √size",
    "update_ratio": "‖Δw‖/‖w‖",
    # Σg: the sum of the gradients over the steps between the two logged points.
    "implicit_lr": "|Δw| / |Σg|",
}
GRADIENT_SUM = "Σg: the sum of the gradients in between"

VIEW_LABELS: dict[str, str] = {
    "variable": "Weights",
    "gradient": "Gradients",
    "output": "Layer outputs",
    "output_gradient": "Output gradients",
}
VIEW_HELP: dict[str, str] = {
    "variable": "trainable variables",
    "gradient": "gradients of the loss w.r.t. the variables",
    "output": "layer outputs (activations)",
    "output_gradient": "gradients of the loss w.r.t. the layer outputs",
}

#: How the tab names a slot in readouts and legends.
SLOT_LABELS: dict[str, str] = {
    "nan_count": "NaN",
    "posinf_count": "+Inf",
    "neginf_count": "−Inf",
    "zero_fraction": "zeros",
    "sign_balance": "sign balance",
    "activation_rate": "activation rate",
    "dead_rate": "dead rate",
    "spatial_dead_rate": "spatial dead rate",
}
#: What a slot means, where the tab explains it.
SLOT_HELP: dict[str, str] = {
    "activation_rate": "share of non-zero elements",
    "dead_rate": "channels zero for every sample and position",
    "spatial_dead_rate": "positions zero for every sample and channel",
    "activity_steps": "“exact”: counted on every step (rectifier outputs); “sampled”: counted on"
    " the statistics steps only (other outputs, which essentially never hold exact zeros), or"
    " on the steps the overhead budget paid (Keras rectifier outputs whose counts cost more)",
}

_ILR = FORMULAS["implicit_lr"]

#: Texts of the tab's charts: ``layers.<mode>`` are the Layers view's modes (button
#: ``label``, tooltip ``help``, ``readout`` label), the others one chart or section each.
CHARTS: dict[str, dict[str, str]] = {
    "layers.values": {"label": "values", "help": "percentiles of the values (linear axis)"},
    "layers.magnitude": {
        "label": "|x| log",
        "help": "percentiles of |x| on a log axis (zeros at the bottom); right axis: orange = sign"
        " balance of the non-zero values (−100%…+100%; a ReLU output reads +100%), dashed grey ="
        " share of exact zeros (0…100%)",
    },
    "layers.rms": {
        "label": "RMS",
        "readout": "RMS",
        "help": f"RMS = {FORMULAS['rms']}, comparable across layers",
    },
    "layers.update": {
        "label": "Δw/w",
        "readout": FORMULAS["update_ratio"],
        "help": f"update-to-weight ratio {FORMULAS['update_ratio']} between logged points"
        " (log axis; ~1e-3 per step is the usual rule of thumb)",
    },
    "layers.cos": {
        "label": "cos",
        "readout": "cos to previous",
        "help": "cosine between consecutive gradient aggregates (−1…1; persistently negative ="
        " oscillation)",
    },
    "layers.ilr": {
        "label": "ILR",
        "help": f"implicit learning rate {_ILR} per element between logged points ({GRADIENT_SUM}):"
        " percentiles over the elements (log axis). Plain SGD: every percentile is the learning"
        " rate (with momentum m about rate / (1 − m)); Adam/RMSprop: the spread is the"
        " per-element step sizes, about rate / |g|. Compare layers: one far from the others is"
        " scaled by something else (clipping, its own rate, no update)",
    },
    "overview.ilr": {
        "title": "Implicit learning rate",
        "help": f"{_ILR} per weight between logged points ({GRADIENT_SUM}): the step size the"
        " optimizer really takes; with plain SGD it is the learning rate",
    },
    "overview.transformer": {
        "title": "Transformer",
        "help": "the probes of attention layers, the output head and every layer output, per"
        " logged point; dashed lines are the reference thresholds the findings use",
    },
    # The same section for a model without attention layers (a classifier's head and
    # outliers): "Transformer" would mislead there.
    "overview.probes": {
        "title": "Output logits and outliers",
        "help": "the probes of the output head and every layer output, per logged point;"
        " dashed lines are the reference thresholds the findings use",
    },
    "transformer.attn": {
        "title": "Attention logit max",
        "help": "largest |q·k/√d| before the softmax, per attention layer (max over heads, the"
        " sampled queries and every key, mask applied; max over the window); dashed: 100,"
        " Megatron-LM's QK-clip threshold",
    },
    "transformer.head": {
        "title": "Output head logits",
        "help": "largest logit (max over the window) and the mean logsumexp log Z over rows"
        " (averaged over the window); dashed: 0, where z-loss keeps log Z",
    },
    "transformer.ratio": {
        "title": "Massive activations: max|a| / median|a|",
        "help": "per layer output, the largest |a| over the median |a| (log axis); dashed: 1000,"
        " a massive activation when max|a| is also above 100",
    },
    "transformer.kurtosis": {
        "title": "Kurtosis of layer outputs",
        "help": "per layer output, m4 / m2² of each statistics step's batch, averaged over the"
        " window (log axis); dashed: 3, a Gaussian (a layer at initialisation)",
    },
    "activity.maps": {
        "title": "Per-channel and spatial activity",
        "help": "share of non-zero values of each channel (over every sample and position) and of"
        " each spatial position (over every sample and channel), over one epoch",
    },
}

#: Percentile points whose slot names ``schema()`` spells out, so that a reader of the
#: schema can check its own formatting against Python's (``f"{q:g}"``: 6 significant
#: digits, an exponent below 1e-4, trailing zeros dropped, round half to even).
_QUANTILE_EXAMPLES: tuple[float, ...] = (
    0.0, 2.5, 12.5, 50.0, 99.9, 100.0, 0.1 + 0.2, 12.3456789, 33.33333333, 99.9999951,
    0.001, 0.0001, 0.00001, 0.000123456789, 2.0 ** -10, 1e-7,
)


def _quantile_prefix(log: bool) -> str:
    # Read off quantile_field itself, so that the prefixes keep one definition.
    return quantile_field(0.0, log=log).removesuffix(f"{0.0:g}")


def schema() -> dict:
    """The format's names and the tab's texts as one JSON-able dict.

    The frontend's ``schema.js`` is this dict, one exported constant per key
    (``tb_introspect.schema_js``); the tab holds no copy of its own.
    """
    return {
        "plugin_name": PLUGIN_NAME,
        "format_version": PROTO_VERSION,
        "tag_prefix": TAG_PREFIX,
        "views": list(VIEWS),
        "cadences": list(CADENCES),
        "default_quantiles": list(DEFAULT_QUANTILES),
        "base_fields": list(BASE_FIELDS),
        "nonfinite_fields": list(NONFINITE_FIELDS),
        "activity_fields": list(ACTIVITY_FIELDS),
        "window_step_fields": list(WINDOW_STEP_FIELDS),
        "view_extra_fields": {view: list(VIEW_EXTRA_FIELDS[view]) for view in VIEWS},
        "ilr_prefix": ILR_PREFIX,
        "quantile_field": {
            "prefix": _quantile_prefix(False),
            "log_prefix": _quantile_prefix(True),
            "format": "g",
            "significant_digits": 6,
            "examples": [[q, quantile_field(q), quantile_field(q, log=True)]
                         for q in _QUANTILE_EXAMPLES],
        },
        "probe_fields": list(PROBE_FIELDS),
        "probe_value_fields": list(PROBE_VALUE_FIELDS),
        "probe_references": dict(PROBE_REFERENCES),
        "metric_fields": list(METRIC_FIELDS),
        "metric_epoch_fields": list(METRIC_EPOCH_FIELDS),
        "metric_epoch_band_fields": list(METRIC_EPOCH_BAND_FIELDS),
        "view_labels": dict(VIEW_LABELS),
        "view_help": dict(VIEW_HELP),
        "slot_labels": dict(SLOT_LABELS),
        "slot_help": dict(SLOT_HELP),
        "formulas": dict(FORMULAS),
        "charts": {k: dict(v) for k, v in CHARTS.items()},
    }
