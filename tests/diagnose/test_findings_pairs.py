"""The findings for bugs a healthy run shares a symptom with, on real trainings in both
frameworks: each pathology of ``findings_pairs.PAIRS`` is caught within 2 epochs of its
onset, read live after every epoch, and its healthy twin shows no warning at any epoch.
Each (scenario, framework) is trained once per session."""

from __future__ import annotations

import pytest

from tests.diagnose.findings_pairs import FRAMEWORKS, PAIRS, train_pair

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::UserWarning")]

PATHOLOGIES = [(n, fw) for n, p in PAIRS.items() if p.in_tests and not p.healthy
               for fw in FRAMEWORKS]
HEALTHY = [(n, fw) for n, p in PAIRS.items() if p.in_tests and p.healthy for fw in FRAMEWORKS]


@pytest.fixture(scope="session")
def pair(tmp_path_factory):
    cache: dict = {}

    def get(name: str, framework: str):
        if (name, framework) not in cache:
            d = tmp_path_factory.mktemp(f"{name}_{framework}")
            cache[name, framework] = train_pair(name, framework, str(d))
        return cache[name, framework]

    return get


def titles(findings):
    return [f"{f.severity} {f.kind}: {f.title}" for f in findings]


@pytest.mark.parametrize(("name", "framework"), PATHOLOGIES)
def test_pathology_is_caught_within_two_epochs_of_its_onset(pair, name, framework) -> None:
    r = pair(name, framework)
    p = PAIRS[name]
    assert len(r.live) == p.epochs
    for kind, (severity, onset) in p.expect.items():
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
    assert f.layers == (["probs"] if framework == "keras" else ["1"])
    assert f.evidence["floor_loss"] == pytest.approx(1.4612, abs=1e-4)
    # The loss is where the floor keeps it: above it, well above a from-logits twin's.
    assert f.evidence["loss_median_at_end"] > f.evidence["floor_loss"]


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_gradient_pileup_grows_where_accumulation_done_right_does_not(pair, framework) -> None:
    f = next(f for f in pair("grad_pileup", framework).findings if f.kind == "gradient_pileup")
    assert f.evidence["growth_orders"] >= 0.5 and f.evidence["points_rising"] >= 2
    twin = pair("grad_accumulation", framework)
    assert "gradient_pileup" not in {f.kind for found in twin.live for f in found}
