"""A slice of the healthy corpus (``tests/diagnose/findings_healthy.py``) in ``make test``:
one run for each rule the corpus found firing on healthy trainings that is fast to train.
No warning or critical may show at any point, read live or at the end.

``benchmarks/findings_validation.py --healthy`` trains the whole corpus (docs/findings.md,
"The healthy corpus").
"""

from __future__ import annotations

import pytest

from tests.diagnose.findings_healthy import IN_TESTS, train_healthy


@pytest.mark.parametrize("name", IN_TESTS)
def test_a_healthy_training_shows_no_warning_at_any_point(name, tmp_path) -> None:
    o = train_healthy(name, str(tmp_path))
    assert o.warnings() == [], o.warnings()
    # It did train to its floor: a classifier to high accuracy, a language model near the
    # chain's entropy.
    if "floor" in o.end:
        assert o.end["loss"] < 1.25 * o.end["floor"], o.end
    else:
        assert o.end["accuracy"] >= 0.85, o.end
