"""``plan.py``: the ``every=N`` rule every front-end follows, and the questions the ``Plan``
answers about each monitored tensor."""

from __future__ import annotations

import numpy as np
import pytest

from tb_introspect.pipeline.failures import Part
from tb_introspect.pipeline.options import Options
from tb_introspect.pipeline.plan import (
    Monitored,
    Plan,
    auto_window,
    is_sampled,
    last_sampled,
    sampled_between,
    sanitize,
    window_due,
)


@pytest.mark.parametrize("every", [1, 2, 3, 7])
def test_the_sampled_steps_are_n_2n_3n(every):
    steps = range(1, 40)
    assert [s for s in steps if is_sampled(s, every)] == list(range(every, 40, every))
    for step in range(0, 40):
        assert last_sampled(step, every) == max(s for s in range(0, step + 1) if s % every == 0)


@pytest.mark.parametrize("every", [1, 2, 3, 5])
def test_an_execution_holds_a_sampled_step_when_one_of_its_steps_is(every):
    for done in range(0, 25):
        for steps in range(1, 12):
            held = any(is_sampled(s, every) for s in range(done + 1, done + steps + 1))
            assert sampled_between(done, steps, every) == held, (done, steps)


def test_the_rule_works_on_a_tensor_of_steps_and_every_epoch_samples_every_step():
    # The traced Keras step evaluates the same expression on a tensor.
    steps = np.arange(1, 13)
    np.testing.assert_array_equal(is_sampled(steps, 4), steps % 4 == 0)
    assert is_sampled(5, "epoch") is True
    assert sampled_between(3, 1, "epoch") is True


def test_the_rule_takes_the_validated_option():
    every = Options.make(every=np.int64(3)).every
    assert type(every) is int and last_sampled(10, every) == 9
    for bad in (0, -2, True, "step", 1.5):
        with pytest.raises(ValueError, match="every must be"):
            Options.make(every=bad)


def spec(view, name, layer, **kw):
    return Monitored(view, name, layer, 0, **kw)


def test_what_a_plan_answers():
    relu = spec("output", "relu", "relu", exact=True)
    head = spec("output", "head", "head", has_grad=False)
    kernel = spec("variable", "dense/kernel", "dense")
    epoch = Plan(Options.make(every="epoch", stats_every=4, views=("variable", "output")),
                 variables=[kernel], outputs=[relu, head])
    steps = Plan(Options.make(every=5), variables=[kernel], outputs=[relu, head])
    assert (epoch.per_epoch, epoch.cadence, epoch.stats_every) == (True, "epoch", 4)
    assert (steps.per_epoch, steps.cadence, steps.stats_every, steps.every) == (
        False, "step", 1, 5)
    assert epoch.output_views == ["output"]
    assert steps.output_views == ["output", "output_gradient"]
    assert not epoch.want("gradient") and steps.want("gradient")
    # A rectifier's activity is exact only with every="epoch" (its counts on every step).
    assert epoch.exact_activity(relu) and not epoch.exact_activity(head)
    assert not steps.exact_activity(relu)
    # No gradient reaches the head: its output gradient is not written.
    assert steps.writes("output", head) and not steps.writes("output_gradient", head)
    assert steps.writes("output_gradient", relu)
    # A tensor switched off, then its whole view.
    steps.failures.switch_off(Part("output", "relu"))
    assert not steps.writes("output", relu) and steps.writes("output", head)
    assert steps.writes("output_gradient", relu)
    steps.failures.switch_off(Part("variable"))
    assert not steps.writes("variable", kernel)


def test_which_layers_are_chosen_and_named_rectifiers():
    by_pattern = Plan(Options.make(layers="conv.*|head", rectifiers=("swish1",)))
    assert [by_pattern.chosen(n) for n in ("conv1", "conv2/bn", "head", "dense")] == [
        True, True, True, False]
    assert not by_pattern.chosen("my_conv")  # a full match
    assert by_pattern.named_rectifier("swish1") and not by_pattern.named_rectifier("swish")
    every = Plan(Options.make())
    assert every.chosen("anything") and not every.named_rectifier("relu")
    with pytest.raises(ValueError, match="not a regular expression"):
        Options.make(layers="conv(")


@pytest.mark.parametrize(("name", "tag"), [("dense/kernel", "dense/kernel"),
                                           ("/a b\tc/", "a_b_c"), ("//", "tensor")])
def test_sanitize(name, tag):
    assert sanitize(name) == tag


def test_the_window_rule_closes_at_each_multiple_past_the_last_point():
    # window=4: a step boundary at or past 4, 8, ... closes the window once.
    assert [s for s in range(1, 13) if window_due(4 * ((s - 1) // 4), s, 4)] == [4, 8, 12]
    assert window_due(8, 10, 4) is False and window_due(6, 8, 4)  # after an epoch's end at 6
    assert window_due(3, 9, 4)  # an execution of several steps that crosses 4 and 8: once
    assert not window_due(0, 100, None)  # per epoch only
    plan = Plan(Options.make(window=4))
    assert plan.per_epoch and plan.window == 4 and plan.cadence == "window"
    assert Plan(Options.make()).cadence == "epoch" and Plan(Options.make(every=4)).cadence == "step"
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="window"):
            Options.make(window=bad)
    with pytest.raises(ValueError, match="window"):
        Options.make(every=4, window=4)


def test_the_trainers_default_window_follows_the_run():
    # A streaming run (epochs unknown or huge) of 300 steps, logging every 10: windows of 10.
    assert auto_window(2**63, 300, 10) == auto_window(None, 300, 10) == 10
    assert auto_window(30, 3000, 50) is None  # 20 to 300 epochs: per epoch
    assert auto_window(3, 18, 1) == 1  # a tiny run: every step, 18 points
    assert auto_window(1, 1000, 500) == 50  # shorter than the interval: one of its divisors
    assert auto_window(2, 192, 10) == 10  # 9 steps: one interval, 19 points
    assert auto_window(2, 290, 10) == 10  # 14 steps: 29 points, not 15 with 20-step windows
    assert auto_window(1, 10**6, 50) == 50_000  # 20 points
    assert auto_window(None, None, None) is None
    for steps, every in ((300, 10), (1000, 7), (10**5, 1), (12345, 100), (50, 1000)):
        w = auto_window(None, steps, every)
        assert 15 <= steps / w <= 300, (steps, every, w)
        assert w % every == 0 or every % w == 0
