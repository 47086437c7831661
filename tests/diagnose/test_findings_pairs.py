"""The findings for bugs a healthy run shares a symptom with, on real trainings in both
frameworks: each pathology of ``findings_pairs.PAIRS`` is caught within 2 epochs of its
onset, read live after every epoch, and its healthy twin shows no warning at any epoch.
Each (scenario, framework) is trained once per session."""

from __future__ import annotations

import pytest

from tests.diagnose.findings_pairs import FRAMEWORKS, PAIRS, train_pair

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::UserWarning")]

#: Most onsets here are epoch 1, shown by epoch 2: four epochs (``Pair.test_epochs``) hold it
#: and one more (the validation benchmark trains the scenarios' own six). The small-data
#: overfitting trains its own thirty.
PATHOLOGIES = [(n, fw) for n, p in PAIRS.items() if not p.healthy for fw in p.in_tests]
HEALTHY = [(n, fw) for n, p in PAIRS.items() if p.healthy for fw in p.in_tests]


def epochs(name: str) -> int:
    p = PAIRS[name]
    return p.epochs if p.test_epochs is None else p.test_epochs


@pytest.fixture(scope="session")
def pair(tmp_path_factory):
    cache: dict = {}

    def get(name: str, framework: str):
        if (name, framework) not in cache:
            d = tmp_path_factory.mktemp(f"{name}_{framework}")
            cache[name, framework] = train_pair(name, framework, str(d), epochs(name))
        return cache[name, framework]

    return get


def titles(findings):
    return [f"{f.severity} {f.kind}: {f.title}" for f in findings]


@pytest.mark.parametrize(("name", "framework"), PATHOLOGIES)
def test_pathology_is_caught_within_two_epochs_of_its_onset(pair, name, framework) -> None:
    r = pair(name, framework)
    p = PAIRS[name]
    assert len(r.live) == epochs(name)
    for kind, (severity, _) in p.expect.items():
        onset = p.onset(kind, r.run)
        first = r.first_epoch_with(kind, severity)
        assert first is not None and first <= onset + 2, (kind, first, titles(r.findings))
        assert any(f.kind == kind and f.severity in ("critical", severity)
                   for f in r.findings), titles(r.findings)


@pytest.mark.parametrize(("name", "framework"), HEALTHY)
def test_healthy_twin_raises_no_warning_at_any_epoch(pair, name, framework) -> None:
    r = pair(name, framework)
    assert r.serious_live() == [], r.serious_live()


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_the_loss_is_recorded_from_compile_or_the_criterion(pair, framework) -> None:
    info = pair("label_smoothing", framework).run.loss_info
    assert info["task"] == "classification" and info["from_logits"] is True
    assert info["label_smoothing"] == pytest.approx(0.2)
    assert info["name"] == ("categorical_crossentropy" if framework == "keras"
                            else "CrossEntropyLoss")


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_loss_floor_says_where_the_softmax_is(pair, framework) -> None:
    f = next(f for f in pair("softmax_logits", framework).findings if f.kind == "loss_floor")
    assert f.evidence["signal"] == "softmax output"
    assert f.layers == (["probs"] if framework == "keras" else ["3"])  # Sequential index
    assert f.evidence["floor_loss"] == pytest.approx(1.4612, abs=1e-4)
    # The loss is where the floor keeps it: above it, well above a from-logits twin's.
    assert f.evidence["loss_median_at_end"] > f.evidence["floor_loss"]


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_gradient_pileup_grows_where_accumulation_done_right_does_not(pair, framework) -> None:
    f = next(f for f in pair("grad_pileup", framework).findings if f.kind == "gradient_pileup")
    assert f.evidence["growth_orders"] >= 0.5 and f.evidence["points_rising"] >= 2
    twin = pair("grad_accumulation", framework)
    assert "gradient_pileup" not in {f.kind for found in twin.live for f in found}


def test_small_data_overfitting_names_the_best_epoch_of_the_logged_curve(pair) -> None:
    """The re-grade on a real PyTorch training (Keras: findings_archs' overfitting_mlp): the
    warning says which epoch had the best validation loss, the one to keep."""
    import numpy as np

    r = pair("overfit_small", "torch")
    f = next(f for f in r.findings if f.kind == "overfitting")
    val = r.run.metrics["val_loss"].field("value")
    assert f.severity == "warning", titles(r.findings)
    assert f.evidence["best_val_epoch"] == int(np.argmin(val))
    assert f"epoch {f.evidence['best_val_epoch']}" in f.title
    assert val[-1] >= 1.25 * val.min()


def test_what_each_front_end_records_of_the_loss() -> None:
    import keras
    import torch

    from tb_introspect import metadata
    from tb_introspect.collect.loss import describe as keras_loss
    from tb_introspect.torch.loss import describe as torch_loss

    def parsed(text):
        return metadata.parse_loss(text)

    assert parsed(keras_loss("sparse_categorical_crossentropy")) == {
        "task": "classification", "from_logits": False, "label_smoothing": 0.0,
        "name": "sparse_categorical_crossentropy"}
    got = parsed(keras_loss(keras.losses.SparseCategoricalCrossentropy(from_logits=True)))
    assert got["from_logits"] is True
    assert parsed(keras_loss(keras.losses.MeanSquaredError()))["task"] == "regression"
    # Keras's own softmax output: the loss takes its logits, whatever from_logits says.
    from tb_introspect.collect.loss import describe_model

    scce = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    for head, from_logits in ((keras.layers.Dense(3, activation="softmax"), False),
                              (keras.layers.Dense(3), True)):
        model = keras.Sequential([keras.Input((4,)), head])
        model.compile("sgd", scce)
        assert parsed(describe_model(model))["from_logits"] is from_logits, head
    assert keras_loss(lambda y, p: p) == "" and keras_loss("hinge") == ""  # not known
    ce = parsed(torch_loss(torch.nn.CrossEntropyLoss(label_smoothing=0.1)))
    assert ce["from_logits"] is True and ce["label_smoothing"] == pytest.approx(0.1)
    assert parsed(torch_loss(torch.nn.NLLLoss()))["from_logits"] is False
    assert parsed(torch_loss(torch.nn.MSELoss()))["task"] == "regression"
    assert parsed(torch_loss({"task": "classification", "from_logits": True}))["task"] == \
        "classification"
    assert torch_loss(None) == "" and torch_loss(torch.nn.CosineEmbeddingLoss()) == ""
    with pytest.raises(ValueError, match="task"):
        torch_loss({"from_logits": True})
    with pytest.raises(ValueError, match="label_smoothing"):
        torch_loss({"task": "classification", "label_smoothing": 1.5})
    with pytest.raises(TypeError, match="criterion"):
        torch_loss("cross_entropy")
