"""Writes ``frontend/src/schema.js``: ``tb_introspect.schema.schema()`` as an ES module.

The frontend imports the format's names and the chart texts from that module instead of
keeping copies. Regenerate it after editing ``metadata.py`` or ``slots.py`` (the format's names) or
``schema.py`` (the tab's texts)::

    python -m tb_introspect.schema_js            # rewrite frontend/src/schema.js
    python -m tb_introspect.schema_js --check    # exit 1 when the committed file is stale

``make frontend`` runs the first before bundling; ``tests/format/test_schema.py`` runs the second.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tb_introspect import schema as tab_schema

#: The generated module, from the repository root.
TARGET = Path("frontend") / "src" / "schema.js"

HEADER = """\
// Generated from tb_introspect/schema.py (schema.schema(), over metadata.py's and slots.py's
// names) by `python -m tb_introspect.schema_js`: do not edit, edit those and regenerate.
// One constant per key of the schema: the format's slot and view names and the
// tab's chart texts, so that the frontend keeps no copy of its own.
"""


def render(schema: dict | None = None) -> str:
    """The text of ``schema.js`` for ``schema`` (default: ``tb_introspect.schema.schema()``)."""
    schema = tab_schema.schema() if schema is None else schema
    parts = [HEADER]
    for key, value in schema.items():
        parts.append(f"\nexport const {key.upper()} = {_literal(value)};\n")
    return "".join(parts)


def _literal(value: object, indent: str = "") -> str:
    """JSON text of ``value``: an object one key a line, a list on one line (short rows)."""
    if isinstance(value, dict) and value:
        inner = indent + "  "
        rows = [f"{inner}{json.dumps(k)}: {_literal(v, inner)}," for k, v in value.items()]
        return "{\n" + "\n".join(rows)[:-1] + f"\n{indent}}}"
    if isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value):
        inner = indent + "  "
        return "[\n" + ",\n".join(inner + _literal(v, inner) for v in value) + f"\n{indent}]"
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


def default_path() -> Path:
    """``frontend/src/schema.js`` of the source checkout this package runs from."""
    return Path(__file__).resolve().parent.parent / TARGET


def main(argv: list[str] | None = None) -> int:
    """Write (or with ``--check`` compare) the generated module; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m tb_introspect.schema_js",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when the file differs from the schema, write nothing")
    parser.add_argument("path", nargs="?", type=Path, default=None,
                        help=f"the module to write (default: {TARGET} of this checkout)")
    args = parser.parse_args(argv)
    path = args.path or default_path()
    text = render()
    if args.check:
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current != text:
            print(f"{path} is stale: run python -m tb_introspect.schema_js", file=sys.stderr)
            return 1
        return 0
    path.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
