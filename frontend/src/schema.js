// Generated from tb_introspect/schema.py (schema.schema(), over metadata.py's and slots.py's
// names) by `python -m tb_introspect.schema_js`: do not edit, edit those and regenerate.
// One constant per key of the schema: the format's slot and view names and the
// tab's chart texts, so that the frontend keeps no copy of its own.

export const PLUGIN_NAME = "introspect";

export const FORMAT_VERSION = 4;

export const TAG_PREFIX = "introspect/";

export const VIEWS = ["variable", "gradient", "output", "output_gradient"];

export const CADENCES = ["step", "epoch", "window"];

export const DEFAULT_QUANTILES = [0.0, 12.5, 25.0, 37.5, 50.0, 62.5, 75.0, 87.5, 100.0];

export const BASE_FIELDS = ["epoch", "count", "finite_count", "nan_count", "posinf_count", "neginf_count", "zero_fraction", "sign_balance", "mean", "std", "rms", "l2", "min", "max", "activation_rate", "dead_rate", "spatial_dead_rate"];

export const NONFINITE_FIELDS = ["nan_count", "posinf_count", "neginf_count"];

export const ACTIVITY_FIELDS = ["activation_rate", "dead_rate", "spatial_dead_rate"];

export const WINDOW_STEP_FIELDS = ["stats_steps", "activity_steps", "steps"];

export const VIEW_EXTRA_FIELDS = {
  "variable": ["update_ratio"],
  "gradient": ["cos_prev"],
  "output": ["stats_steps", "activity_steps", "steps"],
  "output_gradient": ["stats_steps", "steps"]
};

export const ILR_PREFIX = "ilr_";

export const QUANTILE_FIELD = {
  "prefix": "q",
  "log_prefix": "logq",
  "format": "g",
  "significant_digits": 6,
  "examples": [
    [0.0, "q0", "logq0"],
    [2.5, "q2.5", "logq2.5"],
    [12.5, "q12.5", "logq12.5"],
    [50.0, "q50", "logq50"],
    [99.9, "q99.9", "logq99.9"],
    [100.0, "q100", "logq100"],
    [0.30000000000000004, "q0.3", "logq0.3"],
    [12.3456789, "q12.3457", "logq12.3457"],
    [33.33333333, "q33.3333", "logq33.3333"],
    [99.9999951, "q100", "logq100"],
    [0.001, "q0.001", "logq0.001"],
    [0.0001, "q0.0001", "logq0.0001"],
    [1e-05, "q1e-05", "logq1e-05"],
    [0.000123456789, "q0.000123457", "logq0.000123457"],
    [0.0009765625, "q0.000976562", "logq0.000976562"],
    [1e-07, "q1e-07", "logq1e-07"]
  ]
};

export const PROBE_FIELDS = ["row_key", "epoch", "abs_median", "kurtosis", "attn_logit_max", "logit_max", "logit_lse"];

export const PROBE_VALUE_FIELDS = ["abs_median", "kurtosis", "attn_logit_max", "logit_max", "logit_lse"];

export const PROBE_REFERENCES = {
  "attn_logit_max": 100.0,
  "kurtosis": 3.0,
  "massive_abs": 100.0,
  "massive_ratio": 1000.0
};

export const METRIC_FIELDS = ["epoch", "value"];

export const METRIC_EPOCH_FIELDS = ["epoch", "min", "p25", "p50", "p75", "max", "mean", "count"];

export const METRIC_EPOCH_BAND_FIELDS = ["min", "p25", "p50", "p75", "max"];

export const VIEW_LABELS = {
  "variable": "Weights",
  "gradient": "Gradients",
  "output": "Layer outputs",
  "output_gradient": "Output gradients"
};

export const VIEW_HELP = {
  "variable": "trainable variables",
  "gradient": "gradients of the loss w.r.t. the variables",
  "output": "layer outputs (activations)",
  "output_gradient": "gradients of the loss w.r.t. the layer outputs"
};

export const SLOT_LABELS = {
  "nan_count": "NaN",
  "posinf_count": "+Inf",
  "neginf_count": "−Inf",
  "zero_fraction": "zeros",
  "sign_balance": "sign balance",
  "activation_rate": "activation rate",
  "dead_rate": "dead rate",
  "spatial_dead_rate": "spatial dead rate"
};

export const SLOT_HELP = {
  "activation_rate": "share of non-zero elements",
  "dead_rate": "channels zero for every sample and position",
  "spatial_dead_rate": "positions zero for every sample and channel",
  "activity_steps": "“exact”: counted on every step (rectifier outputs); “sampled”: counted on the statistics steps only (other outputs, which essentially never hold exact zeros), or on the steps the overhead budget paid (Keras rectifier outputs whose counts cost more)"
};

export const FORMULAS = {
  "rms": "L2 norm / √size",
  "update_ratio": "‖Δw‖/‖w‖",
  "implicit_lr": "|Δw| / |Σg|"
};

export const CHARTS = {
  "layers.values": {
    "label": "values",
    "help": "percentiles of the values (linear axis)"
  },
  "layers.magnitude": {
    "label": "|x| log",
    "help": "percentiles of |x| on a log axis (zeros at the bottom); right axis: orange = sign balance of the non-zero values (−100%…+100%; a ReLU output reads +100%), dashed grey = share of exact zeros (0…100%)"
  },
  "layers.rms": {
    "label": "RMS",
    "readout": "RMS",
    "help": "RMS = L2 norm / √size, comparable across layers"
  },
  "layers.update": {
    "label": "Δw/w",
    "readout": "‖Δw‖/‖w‖",
    "help": "update-to-weight ratio ‖Δw‖/‖w‖ between logged points (log axis; ~1e-3 per step is the usual rule of thumb)"
  },
  "layers.cos": {
    "label": "cos",
    "readout": "cos to previous",
    "help": "cosine between consecutive gradient aggregates (−1…1; persistently negative = oscillation)"
  },
  "layers.ilr": {
    "label": "ILR",
    "help": "implicit learning rate |Δw| / |Σg| per element between logged points (Σg: the sum of the gradients in between): percentiles over the elements (log axis). Plain SGD: every percentile is the learning rate (with momentum m about rate / (1 − m)); Adam/RMSprop: the spread is the per-element step sizes, about rate / |g|. Compare layers: one far from the others is scaled by something else (clipping, its own rate, no update)"
  },
  "overview.ilr": {
    "title": "Implicit learning rate",
    "help": "|Δw| / |Σg| per weight between logged points (Σg: the sum of the gradients in between): the step size the optimizer really takes; with plain SGD it is the learning rate"
  },
  "overview.transformer": {
    "title": "Transformer",
    "help": "the probes of attention layers, the output head and every layer output, per logged point; dashed lines are the reference thresholds the findings use"
  },
  "overview.probes": {
    "title": "Output logits and outliers",
    "help": "the probes of the output head and every layer output, per logged point; dashed lines are the reference thresholds the findings use"
  },
  "transformer.attn": {
    "title": "Attention logit max",
    "help": "largest |q·k/√d| before the softmax, per attention layer (max over heads, the sampled queries and every key, mask applied; max over the window); dashed: 100, Megatron-LM's QK-clip threshold"
  },
  "transformer.head": {
    "title": "Output head logits",
    "help": "largest logit (max over the window) and the mean logsumexp log Z over rows (averaged over the window); dashed: 0, where z-loss keeps log Z"
  },
  "transformer.ratio": {
    "title": "Massive activations: max|a| / median|a|",
    "help": "per layer output, the largest |a| over the median |a| (log axis); dashed: 1000, a massive activation when max|a| is also above 100"
  },
  "transformer.kurtosis": {
    "title": "Kurtosis of layer outputs",
    "help": "per layer output, m4 / m2² of each statistics step's batch, averaged over the window (log axis); dashed: 3, a Gaussian (a layer at initialisation)"
  },
  "activity.maps": {
    "title": "Per-channel and spatial activity",
    "help": "share of non-zero values of each channel (over every sample and position) and of each spatial position (over every sample and channel), over one epoch"
  }
};
