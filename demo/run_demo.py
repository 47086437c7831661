#!/usr/bin/env python3
"""Train the tb-introspect demo into a logdir; the same as ``tb-introspect demo``.

    python demo/run_demo.py --logdir logs/demo --serve

All options of ``tb-introspect demo --help`` apply. Works from a source checkout without
installing (the repository root is put on the import path).
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":
    # Running from a checkout: make `tb_introspect` importable without `pip install`.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from tb_introspect.cli import main

    sys.exit(main(["demo", *sys.argv[1:]]))
