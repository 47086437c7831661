"""The overhead governor (``pipeline/governor.py``), shared by the Keras callback and the
PyTorch ``Introspector``: which steps are statistics steps, driven by an injected clock
(deterministic)."""

from __future__ import annotations

import pytest

from tb_introspect.pipeline.governor import HEADROOM, Governor, Phase

#: What the governor plans to spend of ``overhead=0.05``.
AIM = 0.05 * HEADROOM


class FakeClock:
    """Virtual seconds; the fake train functions advance it by what they "cost"."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def train(gov: Governor, clock: FakeClock, epochs: int, steps: int, lean: float, full: float,
          log: float, compile_s: float = 5.0, lean_added: float = 0.0) -> list[list[bool]]:
    """Run ``epochs`` windows of ``steps`` executions; which were statistics executions.
    ``lean_added``: the part of ``lean`` a front-end reports as its own instrumentation."""
    seen = {"stats": False, "lean": False}

    def fn(kind: str, cost: float):
        def run():
            clock.now += cost + (0.0 if seen[kind] else compile_s)
            seen[kind] = True
            return kind == "stats"
        return run

    def step() -> bool:
        full_step = gov.choose()
        start = clock()
        (fn("stats", full) if full_step else fn("lean", lean))()
        gov.ran(full_step, clock() - start, instrumented=0.0 if full_step else lean_added)
        return full_step

    taken = []
    for _ in range(epochs):
        gov.begin_window()
        taken.append([step() for _ in range(steps)])
        gov.timed_log(lambda: setattr(clock, "now", clock.now + log))
    return taken


def added_share(taken: list[list[bool]], lean: float, full: float, log: float) -> float:
    steps = sum(len(e) for e in taken)
    extra = sum(sum(e) for e in taken) * (full - lean) + len(taken) * log
    return extra / (steps * lean)


@pytest.mark.parametrize("full", [0.12, 0.2, 0.4, 1.0])
def test_costlier_statistics_get_a_longer_cadence_that_fits_the_budget(full):
    clock = FakeClock()
    gov = Governor(0.05, spacing=8, clock=clock)
    taken = train(gov, clock, epochs=6, steps=400, lean=0.1, full=full, log=0.2)
    for epoch in taken:
        assert epoch[0], "the first step of each window is a statistics step"
    # After the first window (which learns the costs), the added time fits the planned
    # share of the budget, within one statistics step carried over from the first window.
    carried = (full - 0.1) / (len(taken[1:]) * 400 * 0.1)
    assert added_share(taken[1:], 0.1, full, 0.2) <= AIM + carried + 1e-9
    # ... and is not wasted: the cadence is as dense as that allows (within one step).
    per_window = [sum(e) for e in taken[1:]]
    budget = AIM * 400 * 0.1 - 0.2
    assert min(per_window) >= min(budget // (full - 0.1), 400 // 8)


def test_cadence_lengthens_with_cost_and_never_beats_the_spacing():
    counts = {}
    for full in (0.11, 0.15, 0.3, 0.9):
        clock = FakeClock()
        gov = Governor(0.05, spacing=8, clock=clock)
        taken = train(gov, clock, epochs=4, steps=160, lean=0.1, full=full, log=0.0)
        counts[full] = sum(taken[-1])
        gaps = [j - i for e in taken for i, j in zip(
            [k for k, t in enumerate(e) if t], [k for k, t in enumerate(e) if t][1:],
            strict=False)]
        assert min(gaps) >= 8
    assert counts[0.11] == 160 // 8  # cheap statistics: the densest cadence
    assert counts[0.11] > counts[0.15] > counts[0.3] > counts[0.9] >= 1


def test_logging_that_exceeds_the_budget_leaves_only_the_first_steps():
    clock = FakeClock()
    gov = Governor(0.05, spacing=8, clock=clock)
    taken = train(gov, clock, epochs=3, steps=50, lean=0.1, full=0.2, log=10.0)
    assert [sum(e) for e in taken[1:]] == [1, 1]
    assert all(e[0] for e in taken)


def test_no_budget_is_the_fixed_spacing_and_compiles_are_not_counted():
    clock = FakeClock()
    gov = Governor(None, spacing=3, clock=clock)
    taken = train(gov, clock, epochs=2, steps=8, lean=0.1, full=5.0, log=1.0)
    assert taken == [[True, False, False] * 2 + [True, False]] * 2
    assert gov.compile_seconds == {True: pytest.approx(10.0), False: pytest.approx(5.1)}
    assert gov.cadence() == (3, 8)


def test_a_forced_step_and_the_every_step_line():
    clock = FakeClock()
    gov = Governor(0.05, spacing=8, clock=clock)
    train(gov, clock, epochs=1, steps=4, lean=0.1, full=0.2, log=0.0)
    gov.force()
    assert gov.choose()
    every = Governor(None, spacing=1, clock=clock)
    train(every, clock, epochs=2, steps=4, lean=0.1, full=0.2, log=0.05)
    line = every.every_step_cost(0.05)
    assert "50 ms" in line and "200 ms" in line and "every=5" in line


@pytest.mark.parametrize("lean_added", [0.002, 0.004, 0.008])
def test_reported_lean_instrumentation_is_paid_from_the_same_budget(lean_added):
    """A front-end whose lean steps' own work it can time (PyTorch's hooks) reports it: the
    plain step is the lean one less that, and the lean steps' share comes off the budget."""
    clock = FakeClock()
    gov = Governor(0.05, spacing=8, clock=clock)
    plain, full, log, steps = 0.1, 0.2, 0.1, 400
    taken = train(gov, clock, epochs=5, steps=steps, lean=plain + lean_added, full=full,
                  log=log, lean_added=lean_added)
    assert gov.plain_step() == pytest.approx(plain)
    budget = AIM * plain * steps
    for epoch in taken[1:]:
        stats = sum(epoch)
        assert epoch[0]
        if (steps - 1) * lean_added + log >= budget:
            assert stats == 1  # the lean steps spend the budget: each window's first step
        else:  # all that was added fits, within one statistics step of carry-over
            added = stats * (full - plain) + (steps - stats) * lean_added + log
            assert added <= budget + (full - plain) + 1e-9
            assert added >= budget - 2 * (full - plain)  # ... and the budget is used


def test_the_more_lean_instrumentation_the_fewer_statistics_steps():
    counts = []
    for lean_added in (0.0, 0.002, 0.004):
        clock = FakeClock()
        gov = Governor(0.05, spacing=4, clock=clock)
        taken = train(gov, clock, epochs=3, steps=400, lean=0.1 + lean_added, full=0.2,
                      log=0.0, lean_added=lean_added)
        counts.append(sum(taken[-1]))
    assert counts[0] > counts[1] > counts[2] >= 1


def test_run_calls_the_chosen_function_and_accounts_it():
    clock = FakeClock()
    gov = Governor(None, spacing=2, clock=clock)

    def cost(kind: str, seconds: float):
        def fn(x):
            clock.now += seconds
            return kind, x
        return fn

    out = [gov.run(cost("stats", 0.3), cost("lean", 0.1), i, steps=2) for i in range(5)]
    assert out == [("stats", 0), ("lean", 1), ("stats", 2), ("lean", 3), ("stats", 4)]
    # The first call of each function compiles: timed apart, per execution; the rest per step.
    assert gov.compile_seconds == {True: pytest.approx(0.3), False: pytest.approx(0.1)}
    assert list(gov.full) == pytest.approx([0.15, 0.15]) and list(gov.lean) == pytest.approx([0.05])
    assert gov.cadence() == (3, 5)
    assert gov.run(cost("stats", 0.3), cost("lean", 0.1), 5, full=False) == ("lean", 5)


def test_the_step_modes_are_the_front_ends_names():
    assert [m.value for m in Phase] == ["stats", "lean", "off", "auto", "switched"]


def _paced_run(gov: Governor, clock: FakeClock, windows: int, steps: int, *, lean: float,
               full: float, log: float, work: float, lean_added: float = 0.0) -> list[int]:
    """``windows`` windows of ``steps`` executions (the first of each a statistics one),
    each ending with a timed point of ``log`` seconds and ``work`` on the worker; the
    paced window asked for after each (planned: ``steps``)."""
    asked = []
    for _ in range(windows):
        gov.begin_window()
        for _ in range(steps):
            stats = gov.choose()
            start = clock()
            clock.now += full if stats else lean
            gov.ran(stats, clock() - start, instrumented=0.0 if stats else lean_added)
        gov.timed_log(lambda: setattr(clock, "now", clock.now + log), window=True)
        gov.worked("point", work)
        asked.append(gov.paced_window(steps))
    return asked


def test_a_paced_window_grows_to_the_multiple_whose_budget_pays_a_point():
    """Plain 100 ms steps, 5 % of which 4 % planned (``HEADROOM``): 4 ms a step pays; a window
    costs its statistics step's extra 100 ms, a 20 ms end and 30 ms on the worker: 150 ms,
    38 steps, 4 planned windows of 10. Planned until two points were timed (the first pays
    one-time costs: left out after)."""
    clock = FakeClock()
    gov = Governor(0.05, spacing=8, clock=clock)
    asked = _paced_run(gov, clock, 4, 10, lean=0.1, full=0.2, log=0.02, work=0.03)
    assert HEADROOM == 0.8
    assert asked[0] == 10
    assert asked[-1] == 40


def test_a_paced_window_is_the_planned_one_where_points_are_cheap():
    clock = FakeClock()
    gov = Governor(0.05, spacing=8, clock=clock)
    asked = _paced_run(gov, clock, 4, 100, lean=0.1, full=0.11, log=0.001, work=0.001)
    assert asked == [100] * 4


def test_lean_steps_that_cost_the_budget_leave_points_at_epoch_ends_only():
    """A lean step whose own instrumentation (an exact activity count) takes 6 % of a step
    leaves nothing to pay a point with: no window closes before the epoch's end (None)."""
    clock = FakeClock()
    gov = Governor(0.05, spacing=8, clock=clock)
    asked = _paced_run(gov, clock, 4, 10, lean=0.1, full=0.2, log=0.02, work=0.03,
                       lean_added=0.006)
    assert asked[-1] is None


def test_probe_points_are_paid_from_the_budget_before_a_window():
    """The run above with a probe point every planned window (docs/options.md, "Probe
    points") of 12 ms on the training thread and 8 ms on the worker: 2 ms of each step's
    4 ms go to them, 2 ms pay a window's 150 ms: 75 steps, 8 planned windows. Their
    training-thread time is paid at once, the worker's at the next decision."""
    clock = FakeClock()
    gov = Governor(0.05, spacing=8, clock=clock)
    for _ in range(2):
        gov.probed(0.012, 10)
        gov.probe_worked(0.008)
    assert gov.probe_share() == pytest.approx(0.002)
    asked = _paced_run(gov, clock, 4, 10, lean=0.1, full=0.2, log=0.02, work=0.03)
    assert asked[-1] == 80
    gov.choose()  # the last point's worker time paid
    credit = gov.credit
    gov.probed(0.012, 10, step_seconds=0.004)  # the step's probes: paid as instrumentation
    assert gov.credit == pytest.approx(credit - 0.012)
    gov.probe_worked(0.008)
    gov.choose()
    assert gov.credit == pytest.approx(credit - 0.02)


def test_without_a_budget_the_window_is_the_planned_one():
    clock = FakeClock()
    gov = Governor(None, spacing=8, clock=clock)
    assert _paced_run(gov, clock, 4, 10, lean=0.1, full=0.2, log=0.5, work=0.5) == [10] * 4


def test_the_workers_time_is_paid_from_the_budget():
    """The same run with a point's worker CPU from nothing to 2 s: its statistics steps
    become rarer, as they would for a point that cost as much on the training thread."""
    def stats_steps(work: float) -> int:
        clock = FakeClock()
        gov = Governor(0.05, spacing=2, clock=clock)
        taken = 0
        for _ in range(6):
            gov.begin_window()
            for _ in range(400):
                stats = gov.choose()
                taken += stats
                start = clock()
                clock.now += 0.2 if stats else 0.1
                gov.ran(stats, clock() - start)
            gov.worked("point", work)
        return taken
    assert stats_steps(2.0) < stats_steps(0.0) / 2


def _counted_run(gov: Governor, clock: FakeClock, windows: int, steps: int, *, bare: float,
                 counts: float, full: float, log: float) -> list[str]:
    """Windows through ``Governor.run`` with a bare function (a lean step without the
    rectifier counts): each window's executions, ``s`` statistics, ``c`` counted, ``b``
    bare."""
    def fn(kind: str, cost: float):
        def run():
            clock.now += cost
            return kind
        return run

    out = []
    for _ in range(windows):
        gov.begin_window()
        out.append("".join(gov.run(fn("s", full), fn("c", bare + counts),
                                   bare_fn=fn("b", bare)) for _ in range(steps)))
        gov.timed_log(lambda: setattr(clock, "now", clock.now + log))
    return out


def test_counts_the_budget_pays_stay_on_every_step():
    """Costly statistics steps (the window pays only its first): the counts are timed once,
    and at 1 % of a step (under the 4 % the budget gives a step) every step counts again."""
    clock = FakeClock()
    gov = Governor(0.05, 8, clock=clock)
    windows = _counted_run(gov, clock, 6, 48, bare=0.1, counts=0.001, full=0.4, log=0.01)
    assert [w.count("s") for w in windows[1:]] == [1] * 5
    explored = [i for i, w in enumerate(windows) if "b" in w]
    assert len(explored) == 1 and windows[explored[0]].count("b") == 3
    assert all(set(w) == {"s", "c"} for w in windows[explored[0] + 1:])
    assert gov.count_all and gov.counts_seconds == pytest.approx(0.001)


def test_counts_dearer_than_the_budget_are_taken_as_the_credit_pays():
    """Counts at 20 % of a step, statistics steps at four: after the timing window only
    the steps the credit pays count, and what the windows add stays within the budget."""
    clock = FakeClock()
    gov = Governor(0.05, 8, clock=clock)
    bare, counts, full, log = 0.1, 0.02, 0.4, 0.01
    windows = _counted_run(gov, clock, 12, 96, bare=bare, counts=counts, full=full, log=log)
    assert not gov.count_all
    later = windows[-6:]
    assert all(w[0] == "s" for w in later)
    counted = [w.count("c") for w in later]
    assert all(0 < c < 96 / 4 for c in counted), counted
    added = sum(w.count("s") * (full - bare) + w.count("c") * counts + log for w in later)
    assert added / (bare * 96 * len(later)) <= 0.05
    # Decided once: steps that all slow down (the machine, not the counts) change nothing.
    slower = _counted_run(gov, clock, 3, 96, bare=2 * bare, counts=counts, full=2 * full,
                          log=log)
    assert not gov.count_all and gov.counts_seconds == pytest.approx(counts)
    assert all("b" in w for w in slower)


def test_windows_that_pay_more_statistics_steps_never_leave_the_counts_out():
    clock = FakeClock()
    gov = Governor(0.05, 8, clock=clock)
    windows = _counted_run(gov, clock, 6, 96, bare=0.1, counts=0.02, full=0.15, log=0.01)
    assert all("b" not in w for w in windows)
    assert all(w.count("s") > 1 for w in windows)


def test_without_a_bare_function_every_lean_step_counts():
    clock = FakeClock()
    gov = Governor(0.05, 8, clock=clock)
    kinds = []
    for _ in range(4):
        gov.begin_window()
        kinds += [gov.run(lambda: "s", lambda: "c") for _ in range(48)]
        clock.now += 1.0
    assert set(kinds) == {"s", "c"} and gov.counts_seconds is None
