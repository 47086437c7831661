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

    from tb_introspect import loss_field
    from tb_introspect.keras.loss import describe as keras_loss
    from tb_introspect.torch.loss import describe as torch_loss

    def parsed(text):
        return loss_field.parse_loss(text)

    assert parsed(keras_loss("sparse_categorical_crossentropy")) == {
        "task": "classification", "from_logits": False, "label_smoothing": 0.0,
        "name": "sparse_categorical_crossentropy", "untrained": [], "output_module": ""}
    got = parsed(keras_loss(keras.losses.SparseCategoricalCrossentropy(from_logits=True)))
    assert got["from_logits"] is True
    assert parsed(keras_loss(keras.losses.MeanSquaredError()))["task"] == "regression"
    # Keras's own softmax output: the loss takes its logits, whatever from_logits says.
    from tb_introspect.keras.loss import describe_model

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


def test_parameters_in_no_optimizer_group_are_named_and_explain_the_pileup(pair) -> None:
    """The optimizer built over the output layer only: the hidden layers' parameters are
    named from the first epoch, and the gradients that pile up are told apart from a
    missing zero_grad (the loop calls optimizer.zero_grad())."""
    r = pair("head_only_optimizer", "torch")
    assert r.run.loss_info["untrained"] == ["0/weight", "0/bias", "2/weight", "2/bias"]
    f = next(f for f in r.findings if f.kind == "untrained_parameters")
    assert f.severity == "warning" and f.first_epoch == 0 and f.layers == ["0", "2"]
    assert f.evidence["parameters"] == 4 and "0/weight" in f.evidence["names"]
    assert all(t.startswith("introspect/gradient/") for t in f.tags) and len(f.tags) == 4
    pile = next(f for f in r.findings if f.kind == "gradient_pileup")
    assert pile.evidence["cause"] == "not in the optimizer", pile.title
    assert "no optimizer group" in pile.title and "zero_grad() and step()" in pile.title
    # the forgotten zero_grad keeps its own cause
    forgot = next(f for f in pair("grad_pileup", "torch").findings
                  if f.kind == "gradient_pileup")
    assert forgot.evidence["cause"] == "zero_grad missing"


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_backbone_frozen_on_purpose_is_not_untrained(pair, framework) -> None:
    r = pair("frozen_backbone", framework)
    assert not (r.run.loss_info or {}).get("untrained")
    assert "untrained_parameters" not in {f.kind for found in r.live for f in found}


def test_the_optimizer_groups_are_read_again_when_they_change(tmp_path) -> None:
    """A group added before the first point (a layer unfrozen by ``add_param_group``): the
    recorded list follows the optimizer, compared by its groups' sizes at each point."""
    import torch
    from torch import nn

    from tb_introspect.torch import Introspector, modules
    from tests.diagnose.findings_testlib import read_one

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    opt = torch.optim.SGD(model[2].parameters(), lr=0.1)
    assert modules.untrained_parameters(model, opt) == ["0/weight", "0/bias"]
    assert modules.final_module(model) == "Linear"
    assert modules.final_module(nn.Sequential(nn.Sequential(nn.Linear(2, 2), nn.Softmax(1)))) \
        == "Softmax"
    assert modules.final_module(nn.Linear(2, 2)) == ""  # not a Sequential: not known
    # an optimizer over copies of the weights (master weights) says nothing of the model
    copies = torch.optim.SGD([nn.Parameter(w.detach().clone()) for w in model.parameters()])
    assert modules.untrained_parameters(model, copies) == []
    x, y = torch.randn(16, 4), torch.randint(0, 3, (16,))
    with Introspector(tmp_path, model, opt, every="epoch", seed=0,
                      criterion=nn.CrossEntropyLoss()) as intro:
        for s in range(4):
            if s == 2:
                opt.add_param_group({"params": list(model[0].parameters())})
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            intro.step(loss=loss)
        intro.end_epoch()
    assert read_one(str(tmp_path)).loss_info["untrained"] == []


def test_softmax_without_a_declared_criterion_is_read_from_the_module_type(pair) -> None:
    """No criterion= given: the model's last module (nn.Softmax) and a loss that stays on
    the floor at a high accuracy agree; the same Softmax before a loss on its log (done
    right) goes below the floor and stays clean."""
    from tb_introspect.diagnose.classification import softmax_floor

    r = pair("softmax_undeclared", "torch")
    assert r.run.loss_info["task"] is None and r.run.loss_info["output_module"] == "Softmax"
    f = next(f for f in r.findings if f.kind == "loss_floor")
    assert f.evidence["loss_declared"] is False and f.evidence["output_module"] == "Softmax"
    assert f.layers == ["3"] and f.evidence["accuracy_at_end"] >= 0.75
    assert f.evidence["loss_median_at_end"] >= softmax_floor(10)
    twin = pair("softmax_nll_undeclared", "torch")
    assert twin.run.loss_info["output_module"] == "Softmax"
    assert twin.run.metric_epochs["loss"].field("p50")[-1] < 0.8 * softmax_floor(10)
    assert "loss_floor" not in {f.kind for found in twin.live for f in found}


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_units_that_never_differ_are_flagged_from_the_first_epoch(pair, framework) -> None:
    """Every weight one constant: the hidden layers' units stay identical (equal activity in
    every channel, a constant kernel behind identical inputs), flagged at epoch 0 with the
    cause; a deliberately narrow model (8 units) is not."""
    r = pair("constant_init", framework)
    f = next(f for f in r.findings if f.kind == "identical_units")
    assert f.severity == "warning" and f.first_epoch == 0
    assert "constant initialisation" in f.title
    hidden = ["dense1", "dense2"] if framework == "keras" else ["0", "1", "2", "3"]
    assert set(hidden[:2]) <= set(f.layers) <= set(hidden)
    assert f.evidence["layers_equal_activity"] >= 1
    assert all(any(g.kind == "identical_units" for g in found) for found in r.live)
    assert "identical_units" not in {g.kind for found in pair("narrow", framework).live
                                     for g in found}
