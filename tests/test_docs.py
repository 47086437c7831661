"""The documentation keeps up with the code: every option and every constructor parameter of
every front-end is in docs/options.md, and every relative link of README.md and docs/*.md
points at a file that exists."""

from __future__ import annotations

import inspect
import re
import typing
from pathlib import Path
from urllib.parse import unquote

import pytest

REPO = Path(__file__).resolve().parents[1]
OPTIONS_DOC = (REPO / "docs" / "options.md").read_text(encoding="utf-8")


def _front_ends() -> dict[str, object]:
    """Each front-end's constructor, by the name users import it under."""
    from tb_introspect import lightning
    from tb_introspect.jax import Introspector as JaxIntrospector
    from tb_introspect.keras import Introspect, Introspector
    from tb_introspect.torch import Introspector as TorchIntrospector
    from tb_introspect.transformers import IntrospectCallback
    from tb_introspect.writer import NumpyWriter

    return {
        "tb_introspect.keras.Introspect": Introspect,
        "tb_introspect.keras.Introspector": Introspector,
        "tb_introspect.torch.Introspector": TorchIntrospector,
        "tb_introspect.jax.Introspector": JaxIntrospector,
        "tb_introspect.transformers.IntrospectCallback": IntrospectCallback,
        "tb_introspect.lightning.IntrospectCallback": lightning.IntrospectCallback,
        "tb_introspect.writer.NumpyWriter": NumpyWriter,
    }


def _documented(name: str) -> bool:
    return f"`{name}`" in OPTIONS_DOC


def test_every_shared_option_is_documented() -> None:
    from tb_introspect.pipeline.options import OptionArgs

    names = typing.get_type_hints(OptionArgs)
    assert names
    missing = [n for n in names if not _documented(n)]
    assert not missing, f"options missing from docs/options.md: {missing}"


def test_every_front_end_parameter_is_documented() -> None:
    missing = []
    for front_end, cls in _front_ends().items():
        assert f"`{front_end}(" in OPTIONS_DOC, f"docs/options.md has no signature of {front_end}"
        for p in inspect.signature(cls).parameters.values():
            if p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
                continue  # **options: the shared options, checked above
            if not _documented(p.name):
                missing.append(f"{front_end}: {p.name}")
    assert not missing, f"parameters missing from docs/options.md: {missing}"


def _docs() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


#: ``[text](target)`` and ``![alt](target)``, also when the text spans lines.
LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def _relative_links(text: str) -> list[str]:
    text = re.sub(r"```.*?```", "", text, flags=re.S)  # code blocks hold no links
    out = []
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, flags=re.I) or target.startswith("#"):
            continue  # http:, mailto:, ... and anchors within the page
        out.append(unquote(target.split("#", 1)[0]))
    return out


@pytest.mark.parametrize("doc", _docs(), ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(doc: Path) -> None:
    broken = [t for t in _relative_links(doc.read_text(encoding="utf-8"))
              if not (doc.parent / t).exists()]
    assert not broken, f"{doc.relative_to(REPO)}: links to missing files: {broken}"


def test_readme_links_its_docs() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    for name in ("options.md", "hosting.md", "benchmarks.md", "reading-the-tab.md"):
        assert f"(docs/{name})" in readme, name


def test_link_check_finds_links() -> None:
    links = _relative_links("see [a](docs/a.md#x) and ![b\nc](images/b.png), [web](https://x.y)"
                            " and [here](#top)")
    assert links == ["docs/a.md", "images/b.png"]
