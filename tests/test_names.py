"""One public name per thing, alike across frameworks; a renamed one still works for a
release and says so once."""

from __future__ import annotations

import warnings

import pytest


def test_each_front_end_under_its_framework() -> None:
    from tb_introspect import keras, lightning, torch, transformers
    from tb_introspect.keras.callback import Introspect
    from tb_introspect.keras.introspector import Introspector as KerasLoop

    assert keras.Introspect is Introspect and keras.Introspector is KerasLoop
    assert torch.Introspector.__module__ == "tb_introspect.torch.introspector"
    assert transformers.IntrospectCallback.__name__ == "IntrospectCallback"
    assert lightning.IntrospectCallback.__name__ == "IntrospectCallback"


@pytest.mark.parametrize(("module", "old", "new"), [
    ("tb_introspect", "Introspector", "tb_introspect.keras.Introspector"),
    ("tb_introspect.lightning", "Introspect", "tb_introspect.lightning.IntrospectCallback"),
    ("tb_introspect.plugin.reader", "read_logdir", "tb_introspect.read.read_logdir"),
    ("tb_introspect.plugin.reader", "read_run", "tb_introspect.read.read_run"),
    ("tb_introspect.rundata", "RunSeries", "tb_introspect.read.RunSeries"),
])
def test_an_old_name_warns_once_and_is_the_new_thing(module, old, new) -> None:
    import importlib

    from tb_introspect import aliases

    aliases._said.discard(f"{module}.{old}")
    mod = importlib.import_module(module)
    new_module, _, new_name = new.rpartition(".")
    want = getattr(importlib.import_module(new_module), new_name)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = getattr(mod, old)
        again = getattr(mod, old)
    assert first is want and again is want
    said = [w for w in caught if issubclass(w.category, FutureWarning)]
    assert len(said) == 1 and new in str(said[0].message), [str(w.message) for w in caught]
    assert said[0].filename == __file__  # it points at the user's line


def test_an_unknown_name_is_an_attribute_error() -> None:
    import tb_introspect.lightning

    with pytest.raises(AttributeError, match="Introspektor"):
        tb_introspect.lightning.Introspektor  # noqa: B018
    import tb_introspect.plugin.reader

    with pytest.raises(AttributeError, match="parse_tag_info"):  # internal: moved, not kept
        tb_introspect.plugin.reader.parse_tag_info  # noqa: B018
