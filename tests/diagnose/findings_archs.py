"""Trainings beyond MLPs and CNNs for validating the findings: pathologies and healthy twins.

Each builder is ``build(total_steps) -> (model, optimizer)`` for
:func:`findings_testlib.train_logged`; :data:`SCENARIOS` says with which data, loss and
number of epochs each one is trained, and what it must show (``expect``: kind -> lowest
severity and the epoch the pathology starts). Data are the digits
(shipped with scikit-learn) seen as images, as 8 rows of 8 pixels (a sequence), as 64
pixel-intensity tokens, or as their own reconstruction target; nothing is downloaded.
``tests/diagnose/test_findings_archs.py`` trains a subset in ``make test``;
``benchmarks/findings_validation.py`` trains all of them and prints the validation table
of docs/findings.md.

TensorFlow is imported inside the builders only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tb_introspect.demo.data import Digits, load_digits

# ---------------------------------------------------------------- data


@dataclass(frozen=True)
class Data:
    """A train/validation split (any shapes)."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_val: np.ndarray
    y_val: np.ndarray


def digits() -> Digits:
    return load_digits()


def digit_rows() -> Data:
    """Each image as a sequence of 8 rows of 8 pixels (recurrent and attention models)."""
    d = load_digits()
    return Data(d.x_train[..., 0], d.y_train, d.x_val[..., 0], d.y_val)


def digit_tokens() -> Data:
    """Each image as 64 tokens, its pixel intensities 0..16 (embedding models)."""
    d = load_digits()
    tok = lambda x: np.rint(x.reshape(len(x), 64) * 16).astype("int32")  # noqa: E731
    return Data(tok(d.x_train), d.y_train, tok(d.x_val), d.y_val)


def digit_pixels() -> Data:
    """Each flattened image as its own target (an autoencoder under MSE)."""
    d = load_digits()
    flat = lambda x: x.reshape(len(x), 64)  # noqa: E731
    return Data(flat(d.x_train), flat(d.x_train), flat(d.x_val), flat(d.x_val))


def shuffled_labels(n: int = 384) -> Data:
    """``n`` training samples with labels drawn at random: nothing to learn but the
    samples themselves."""
    d = load_digits()
    rng = np.random.default_rng(1)
    return Data(d.x_train[:n], rng.integers(0, 10, n).astype("int32"), d.x_val, d.y_val)


def noisy_few(n: int = 192, noise: float = 1 / 3) -> Data:
    """192 training samples, a third of them with a wrong label."""
    d = load_digits()
    y = d.y_train[:n].copy()
    rng = np.random.default_rng(0)
    wrong = rng.choice(n, int(noise * n), replace=False)
    y[wrong] = (y[wrong] + rng.integers(1, 10, wrong.size)) % 10  # always another class
    return Data(d.x_train[:n], y, d.x_val, d.y_val)


# ---------------------------------------------------------------- models


def _head(x, name: str = "classifier", activation: str = "softmax"):
    from keras import layers

    return layers.Dense(10, activation=activation, name=name)(x)


def _mlp(name: str, hidden: list, *, activation: str = "softmax", inputs=(8, 8, 1)):
    import keras
    from keras import layers

    return keras.Sequential(
        [keras.Input(inputs, name="image"), layers.Flatten(name="flatten"), *hidden,
         layers.Dense(10, activation=activation, name="classifier")],
        name=name,
    )


def build_gru(total_steps: int):
    """GRU over the 8 rows of each digit, Adam 3e-3 (healthy)."""
    import keras
    from keras import layers

    model = keras.Sequential([
        keras.Input((8, 8), name="rows"),
        layers.GRU(32, name="gru"),
        layers.Dense(10, activation="softmax", name="classifier"),
    ], name="gru")
    return model, keras.optimizers.Adam(3e-3)


def build_lstm(total_steps: int):
    """LSTM over the 8 rows of each digit, Adam 3e-3 (healthy)."""
    import keras
    from keras import layers

    model = keras.Sequential([
        keras.Input((8, 8), name="rows"),
        layers.LSTM(32, name="lstm"),
        layers.Dense(10, activation="softmax", name="classifier"),
    ], name="lstm")
    return model, keras.optimizers.Adam(3e-3)


def _attention_model(name: str):
    """Rows -> Dense(32) -> self-attention (2 heads) + residual -> LayerNorm -> feed-forward
    + residual -> LayerNorm -> mean over rows -> softmax."""
    import keras
    from keras import layers

    x_in = keras.Input((8, 8), name="rows")
    x = layers.Dense(32, name="embed")(x_in)
    a = layers.MultiHeadAttention(num_heads=2, key_dim=16, name="attention")(x, x)
    x = layers.LayerNormalization(name="norm1")(layers.Add(name="res1")([x, a]))
    f = layers.Dense(64, activation="relu", name="ff1")(x)
    f = layers.Dense(32, name="ff2")(f)
    x = layers.LayerNormalization(name="norm2")(layers.Add(name="res2")([x, f]))
    x = layers.GlobalAveragePooling1D(name="pool")(x)
    return keras.Model(x_in, _head(x), name=name)


def build_attention(total_steps: int):
    """Self-attention block with LayerNorm, Adam 1e-3 (healthy)."""
    import keras

    return _attention_model("attention"), keras.optimizers.Adam(1e-3)


def build_attention_lr_too_high(total_steps: int):
    """The same block at Adam 0.05: the loss jumps above chance in the first epoch and
    oscillates from there."""
    import keras

    return _attention_model("attention_lr_high"), keras.optimizers.Adam(0.05)


def build_lstm_lr_too_high(total_steps: int):
    """The LSTM at plain SGD 5.0 with momentum 0.9, no clipping."""
    import keras
    from keras import layers

    model = keras.Sequential([
        keras.Input((8, 8), name="rows"),
        layers.LSTM(32, name="lstm"),
        layers.Dense(10, activation="softmax", name="classifier"),
    ], name="lstm_lr_too_high")
    return model, keras.optimizers.SGD(5.0, momentum=0.9)


def build_embedding_dead(total_steps: int):
    """The embedding model with its hidden Dense biased to -3: its ReLUs never fire."""
    import keras
    from keras import layers

    model = keras.Sequential([
        keras.Input((64,), dtype="int32", name="tokens"),
        layers.Embedding(17, 8, name="embedding"),
        layers.Flatten(name="flatten"),
        layers.Dense(64, activation="relu", bias_initializer=keras.initializers.Constant(-3.0),
                     name="dense"),
        layers.Dense(10, activation="softmax", name="classifier"),
    ], name="embedding_dead")
    return model, keras.optimizers.Adam(2e-3)


def _resnet_bn(name: str, momentum: float):
    """Residual CNN with BatchNorm: stem conv, two residual blocks, global pooling; Adam 1e-3."""
    import keras
    from keras import layers

    def bn(n: str):
        return layers.BatchNormalization(momentum=momentum, name=n)

    x_in = keras.Input((8, 8, 1), name="image")
    x = layers.Conv2D(16, 3, padding="same", use_bias=False, name="stem")(x_in)
    x = layers.Activation("relu", name="stem_relu")(bn("stem_bn")(x))
    for b in (1, 2):
        y = layers.Conv2D(16, 3, padding="same", use_bias=False, name=f"b{b}_conv1")(x)
        y = layers.Activation("relu", name=f"b{b}_relu1")(bn(f"b{b}_bn1")(y))
        y = layers.Conv2D(16, 3, padding="same", use_bias=False, name=f"b{b}_conv2")(y)
        y = bn(f"b{b}_bn2")(y)
        x = layers.Activation("relu", name=f"b{b}_out")(layers.Add(name=f"b{b}_add")([x, y]))
    x = layers.GlobalAveragePooling2D(name="pool")(x)
    return keras.Model(x_in, _head(x), name=name), keras.optimizers.Adam(1e-3)


def build_resnet_bn(total_steps: int):
    """The residual BatchNorm CNN with Keras's default momentum 0.99: in 6 epochs (270 steps)
    the moving statistics used in evaluation lag the batch statistics, and the validation
    accuracy stays far below the training accuracy (a train/eval gap)."""
    return _resnet_bn("resnet_bn", 0.99)


def build_resnet_bn_fast(total_steps: int):
    """Its healthy twin: BatchNorm momentum 0.9, moving statistics that keep up."""
    return _resnet_bn("resnet_bn_fast", 0.9)


def build_embedding(total_steps: int):
    """Embedding of the 64 pixel tokens -> Flatten -> Dense(64, relu) -> softmax (healthy)."""
    import keras
    from keras import layers

    model = keras.Sequential([
        keras.Input((64,), dtype="int32", name="tokens"),
        layers.Embedding(17, 8, name="embedding"),
        layers.Flatten(name="flatten"),
        layers.Dense(64, activation="relu", name="dense"),
        layers.Dense(10, activation="softmax", name="classifier"),
    ], name="embedding")
    return model, keras.optimizers.Adam(2e-3)


def build_autoencoder(total_steps: int):
    """64 -> 32 -> 8 -> 32 -> 64 autoencoder under MSE, Adam 3e-3 (healthy regression)."""
    import keras
    from keras import layers

    model = keras.Sequential([
        keras.Input((64,), name="pixels"),
        layers.Dense(32, activation="relu", name="enc1"),
        layers.Dense(8, name="code"),
        layers.Dense(32, activation="relu", name="dec1"),
        layers.Dense(64, name="reconstruction"),
    ], name="autoencoder")
    return model, keras.optimizers.Adam(3e-3)


def build_memorising_mlp(total_steps: int):
    """2 x 256 ReLU MLP with Adam on shuffled labels: it can only memorise."""
    import keras
    from keras import layers

    model = _mlp("memorising_mlp", [layers.Dense(256, activation="relu", name="dense1"),
                                    layers.Dense(256, activation="relu", name="dense2")])
    return model, keras.optimizers.Adam(3e-3)


def build_overfitting_mlp(total_steps: int):
    """A wide MLP with Adam on 192 noisy samples: it memorises them, noise included."""
    import keras
    from keras import layers

    model = _mlp("overfitting_mlp", [layers.Dense(256, activation="relu", name="dense1"),
                                     layers.Dense(256, activation="relu", name="dense2")])
    return model, keras.optimizers.Adam(3e-3)


def build_l2_collapse(total_steps: int):
    """An L2 penalty of 1.0 on every kernel and bias, large initial weights: the loss falls
    from ~150 to ln 10 as the weights decay to zero, and the model predicts 1/10 each."""
    import keras
    from keras import layers

    reg = keras.regularizers.L2(1.0)
    init = keras.initializers.RandomNormal(stddev=0.5)
    dense = lambda n, act, name: layers.Dense(  # noqa: E731
        n, activation=act, kernel_initializer=init, kernel_regularizer=reg,
        bias_regularizer=reg, name=name)
    model = keras.Sequential([
        keras.Input((8, 8, 1), name="image"), layers.Flatten(name="flatten"),
        dense(64, "relu", "dense1"), dense(64, "relu", "dense2"),
        dense(10, "softmax", "classifier"),
    ], name="l2_collapse")
    return model, keras.optimizers.SGD(0.05)


def build_relu_output(total_steps: int):
    """Dense(10, activation="relu") as the output under a from-logits loss."""
    import keras
    from keras import layers

    model = _mlp("relu_output", [layers.Dense(64, activation="relu", name="dense1")],
                 activation="relu")
    return model, keras.optimizers.Adam(1e-3)


def build_logits_output(total_steps: int):
    """The healthy twin of ``relu_output``: a linear output under the same loss."""
    import keras
    from keras import layers

    model = _mlp("logits_output", [layers.Dense(64, activation="relu", name="dense1")],
                 activation=None)
    return model, keras.optimizers.Adam(1e-3)


def build_tiny_init(total_steps: int):
    """Five ReLU layers initialised with N(0, 0.01): each layer shrinks its input ~20x, the
    fifth layer's outputs are ~10^-6 of the first's."""
    import keras
    from keras import layers

    init = keras.initializers.RandomNormal(stddev=0.01)
    model = _mlp("tiny_init", [layers.Dense(64, activation="relu", kernel_initializer=init,
                                            name=f"dense{i}") for i in range(1, 6)])
    return model, keras.optimizers.SGD(0.05, momentum=0.9)


def _demo(name: str) -> Callable[[int], tuple[Any, Any]]:
    def build(total_steps: int):
        from tb_introspect.demo.models import get_scenario

        return get_scenario(name).build(total_steps)

    return build


def _saturated(total_steps: int):
    from tests.diagnose.findings_testlib import build_saturated_tanh_mlp

    return build_saturated_tanh_mlp(total_steps)


def _dead_onset(run: Any, threshold: float) -> int:
    """First epoch where a hidden layer's logged dead rate reaches ``threshold``."""
    epochs = [int(s.epochs[j]) for s in run.tensors["output"][:-1]
              for j in np.flatnonzero(s.field("dead_rate") >= threshold)[:1]]
    return min(epochs)


def _anti_aligned_onset(run: Any) -> int:
    """First epoch where the median over kernels of the gradient ``cos_prev`` is negative."""
    kernels = [s for s in run.tensors["gradient"] if len(s.info.shape) >= 2]
    from tb_introspect.diagnose.core import nanmedian

    cos = nanmedian(np.array([s.field("cos_prev") for s in kernels]), axis=0)
    return int(kernels[0].epochs[np.flatnonzero(cos < 0)[0]])


# ---------------------------------------------------------------- the scenarios


def _sce(from_logits: bool = False):
    import keras

    return keras.losses.SparseCategoricalCrossentropy(from_logits=from_logits)


def _mse():
    import keras

    return keras.losses.MeanSquaredError()


@dataclass(frozen=True)
class Scenario:
    """One validation training: what it trains on, for how long, and what it must show."""

    build: Callable[[int], tuple[Any, Any]]
    data: Callable[[], Any]
    epochs: int
    #: kind -> (lowest severity it must reach, epoch the pathology starts, or a function
    #: reading that epoch off the logged run); empty: a healthy run, where no warning may fire
    expect: dict[str, tuple[str, int | Callable[[Any], int]]] = field(default_factory=dict)
    loss: Callable[[], Any] = _sce
    accuracy: bool = True
    batch_size: int = 32
    note: str = ""
    #: False: trained by the benchmark only (the other findings tests already train it)
    in_tests: bool = True

    def onset(self, kind: str, run: Any) -> int:
        """The epoch the pathology behind ``kind`` starts, in ``run``."""
        at = self.expect[kind][1]
        return at(run) if callable(at) else at

    @property
    def healthy(self) -> bool:
        return not self.expect


SCENARIOS: dict[str, Scenario] = {
    # pathologies: expect = {kind: (lowest severity, onset epoch)}, the onset read off the
    # logged curves (docs/findings.md, "Validation", says how for each)
    "memorising_mlp": Scenario(build_memorising_mlp, shuffled_labels, 20,
                               {"overfitting": ("warning", 2)}, note="384 shuffled labels"),
    "overfitting_mlp": Scenario(build_overfitting_mlp, noisy_few, 30,
                                {"overfitting": ("warning", 14)},
                                note="192 samples, 1/3 mislabelled"),
    "l2_collapse": Scenario(build_l2_collapse, digits, 6,
                            {"weight_collapse": ("warning", 0), "loss_at_chance": ("warning", 1)},
                            note="L2 1.0 on every weight"),
    "relu_output": Scenario(build_relu_output, digits, 6, {"rectified_output": ("warning", 0)},
                            loss=lambda: _sce(True), note="Dense(10, relu), from-logits loss"),
    "attention_lr_too_high": Scenario(build_attention_lr_too_high, digit_rows, 6,
                                      {"early_instability": ("warning", 0)}, note="Adam 0.05"),
    "tiny_init": Scenario(build_tiny_init, digits, 4, {"poor_initialization": ("warning", 0)},
                          note="N(0, 0.01) kernels, 5 ReLU layers"),
    "resnet_bn": Scenario(build_resnet_bn, digits, 6, {"train_eval_gap": ("warning", 1)},
                          note="residual CNN, BatchNorm momentum 0.99, 6 epochs"),
    # the demo's pathologies and two more, for the existing rules (trained by
    # test_findings_training.py there; here by the benchmark only)
    "dying_relu_mlp": Scenario(_demo("dying_relu_mlp"), digits, 8,
                               {"dead_units": ("warning", lambda r: _dead_onset(r, 0.5))},
                               note="demo: biases start at -1", in_tests=False),
    "vanishing_sigmoid_mlp": Scenario(_demo("vanishing_sigmoid_mlp"), digits, 4,
                                      {"vanishing_gradients": ("warning", 0)},
                                      note="demo: 8 sigmoid layers", in_tests=False),
    "lr_too_high_cnn": Scenario(_demo("lr_too_high_cnn"), digits, 8,
                                {"loss_rising": ("warning", 2)},
                                note="demo: 33x the healthy rate from epoch 2, clipped",
                                in_tests=False),
    "saturated_tanh_mlp": Scenario(_saturated, digits, 4, {"saturated_units": ("warning", 0)},
                                   note="tanh, N(0, 1) kernels", in_tests=False),
    "lstm_lr_too_high": Scenario(build_lstm_lr_too_high, digit_rows, 6,
                                 {"gradient_oscillation": ("warning", _anti_aligned_onset)},
                                 note="LSTM, SGD 5.0", in_tests=False),
    "embedding_dead": Scenario(build_embedding_dead, digit_tokens, 6,
                               {"dead_units": ("warning", 0)}, note="embedding, ReLU bias -3",
                               in_tests=False),
    # healthy: no warning may fire at any epoch
    "healthy_cnn": Scenario(_demo("healthy_cnn"), digits, 8, note="demo", in_tests=False),
    "gru": Scenario(build_gru, digit_rows, 6),
    "lstm": Scenario(build_lstm, digit_rows, 6),
    "attention": Scenario(build_attention, digit_rows, 6),
    "resnet_bn_fast": Scenario(build_resnet_bn_fast, digits, 6, note="BatchNorm momentum 0.9"),
    "embedding": Scenario(build_embedding, digit_tokens, 6),
    "autoencoder_mse": Scenario(build_autoencoder, digit_pixels, 8, loss=_mse, accuracy=False),
    "logits_output": Scenario(build_logits_output, digits, 6, loss=lambda: _sce(True)),
}


# ---------------------------------------------------------------- training and live reading


@dataclass
class LiveRun:
    """A scenario's training, with the findings read back after every epoch."""

    name: str
    run: Any  # RunSeries at the end
    findings: list  # find_issues at the end
    #: live[e]: find_issues of the logdir as read right after epoch e
    live: list[list] = field(default_factory=list)

    def first_epoch_with(self, kind: str, severity: str = "warning") -> int | None:
        """First epoch whose live reading shows ``kind`` at ``severity`` or worse."""
        order = {"critical": 0, "warning": 1, "info": 2}
        for e, found in enumerate(self.live):
            if any(f.kind == kind and order[f.severity] <= order[severity] for f in found):
                return e
        return None

    def serious_live(self) -> list[tuple[int, str, str]]:
        """(epoch, kind, title) of every warning or critical in any live reading."""
        return [(e, f.kind, f.title) for e, found in enumerate(self.live) for f in found
                if f.severity in ("warning", "critical")]


def train_scenario(name: str, logdir: str, epochs: int | None = None) -> LiveRun:
    """Train scenario ``name`` into ``logdir``, reading the logdir back after every epoch
    with the plugin's offline reader and running the findings on what it has so far."""
    from tb_introspect.diagnose import find_issues
    from tests.diagnose.findings_testlib import read_one, train_logged

    sc = SCENARIOS[name]
    live: list[list] = []
    train_logged(logdir, sc.build, epochs=epochs or sc.epochs, data=sc.data(), loss=sc.loss(),
                 accuracy=sc.accuracy, validation=True, batch_size=sc.batch_size,
                 on_epoch=lambda e: live.append(find_issues(read_one(logdir))))
    run = read_one(logdir)
    return LiveRun(name, run, find_issues(run), live)
