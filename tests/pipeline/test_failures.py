"""``failures.py``: a failure switches its part off with one warning per cause; training goes
on (the pipeline's own failures: ``test_pipeline.py``)."""

from __future__ import annotations

import warnings

import pytest

from tb_introspect.pipeline.failures import Failures, Part, short_error


def warned(fn, *args, **kw):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        out = fn(*args, **kw)
    return out, [str(w.message) for w in seen]


def test_tensors_of_one_view_failing_alike_are_one_warning():
    f = Failures()
    for name in ("conv1", "conv2", "conv3"):
        _, seen = warned(f.fail, Part("output", name), ValueError("no gradient"))
        assert len(seen) == (1 if name == "conv1" else 0)
    assert f.is_off("output", "conv2") and not f.is_off("output", "dense")
    assert not f.is_off("output")
    _, seen = warned(f.fail, Part("output", "dense"), TypeError("other cause"))
    assert len(seen) == 1 and "output dense: instrumentation failed (TypeError" in seen[0]
    _, seen = warned(f.fail, [Part("gradient")], ValueError("no gradient"))
    assert seen == ["tb_introspect: gradient view: instrumentation failed (ValueError: no"
                    " gradient); it is off for the rest of training, as is any other gradient"
                    " failing the same way; training goes on"]
    assert f.is_off("gradient", "any/tensor")


def test_guard_returns_the_value_or_switches_the_part_off():
    f = Failures()
    assert f.guard("metrics", lambda a, b: a + b, 1, 2) == 3

    def boom():
        raise RuntimeError("ring unreadable")

    out, seen = warned(f.guard, "metrics", boom)
    assert out is None and Part("metrics") in f.off and len(seen) == 1
    calls = []
    assert f.guard("metrics", calls.append, 1) is None and calls == []  # off: not run


def test_a_write_error_is_handed_to_its_own_handler():
    f = Failures()

    def full():
        raise OSError(28, "No space left on device")

    handled = []
    out, seen = warned(f.guard, "statistics", full, on_write_error=lambda e: handled.append(e)
                       or True)
    assert out is None and seen == [] and f.off == set()
    assert isinstance(handled[0], OSError)


@pytest.mark.parametrize(("text", "short"), [
    ("Graph execution error:\n\nDetected at node foo\nFile \"x.py\", line 3\n"
     "{{function_node __inference_step_1}} Incompatible shapes: [2] vs. [3]\n"
     "[[{{node add}}]] [Op:__inference_step_1]", "Incompatible shapes: [2] vs. [3]"),
    ("", "ValueError"),
    ("x" * 400, "x" * 297 + "..."),
])
def test_short_error_keeps_the_line_that_says_what_happened(text, short):
    assert short_error(ValueError(text)) == short
