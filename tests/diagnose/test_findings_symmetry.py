"""``identical_units`` on synthetic series: a constant weight means symmetric units only
when an error signal reached it."""

from __future__ import annotations

from tb_introspect.diagnose import find_issues
from tests.diagnose.findings_synth import epochs_steps, kinds, run, tensor

STEPS = epochs_steps(6)


def _layer(bias_gradient_zeros: float) -> list:
    """A dense layer: a random kernel and a bias stuck at -1, whose gradient has the given
    share of exact zeros at every point."""
    return [
        tensor("variable", "dense1", 1, STEPS, shape=(64, 32), min=-0.2, max=0.2),
        tensor("variable", "dense1", 1, STEPS, name="dense1/bias", shape=(32,), min=-1.0,
               max=-1.0),
        tensor("gradient", "dense1", 1, STEPS, shape=(64, 32), zero_fraction=0.3),
        tensor("gradient", "dense1", 1, STEPS, name="dense1/bias", shape=(32,),
               zero_fraction=bias_gradient_zeros),
    ]


def test_a_constant_bias_with_a_gradient_means_symmetric_units() -> None:
    assert "identical_units" in kinds(find_issues(run(*_layer(0.0))))


def test_a_constant_bias_that_no_gradient_reached_is_left_to_dead_units() -> None:
    # Biases that start at -1 under ReLUs that never fire: they stay -1 for want of a
    # gradient; the units are dead, not alike.
    assert "identical_units" not in kinds(find_issues(run(*_layer(1.0))))
