"""Statistics of sharded arrays inside ``jit`` equal the unsharded ones: 8 CPU devices
(``--xla_force_host_platform_device_count``) on a (data, model) mesh, in a child process
(the device count is fixed when JAX starts)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tb_introspect import slots
from tb_introspect.read.provider import read_logdir

ROOT = Path(__file__).resolve().parents[2]
COUNTS = ("count", "finite_count", "nan_count", "posinf_count", "neginf_count",
          "zero_fraction", "activation_rate", "dead_rate")


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("jax_sharded")
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=8"
    done = subprocess.run([sys.executable, "-m", "tests.jax.jax_sharded_worker", str(log_dir)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "XLA_FLAGS": flags.strip()})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), log_dir


def test_a_sharded_fold_is_the_whole_arrays(sharded):
    """Three steps of one array folded sharded over 8 devices and whole: counts, extremes
    and the sample (keys and values) equal, the float32 sums to their rounding."""
    out, _ = sharded
    assert out["devices"] == 8
    whole, split = out["states"]["whole"], out["states"]["sharded"]
    assert out["states"]["sharded_shards"] == 8 and out["states"]["whole_shards"] == 1
    assert split["ext"] == whole["ext"]
    assert split["keys"] == whole["keys"] and split["vals"] == whole["vals"]
    hi_w, hi_s = np.array(whole["hi"]) + whole["lo"], np.array(split["hi"]) + split["lo"]
    sums = [6, 7, 8]  # sum, m2, count * mean**2: float32 sums in another order
    counts = [i for i in range(hi_w.size) if i not in sums]
    np.testing.assert_array_equal(hi_s[counts], hi_w[counts])
    np.testing.assert_allclose(hi_s[sums], hi_w[sums], rtol=1e-5)


def test_a_sharded_training_writes_the_whole_ones_statistics(sharded):
    """Four steps with the hidden layers' parameters sharded over ``model`` and the batches
    over ``data``, and on one device: every view's points at every step agree, counts exactly,
    the rest to the float32 rounding that the reductions' order moves."""
    _, log_dir = sharded
    runs = read_logdir(str(log_dir))
    split, whole = runs["sharded"], runs["whole"]
    assert set(split.tensors) == set(whole.tensors) == set(slots.VIEWS)
    for view in slots.VIEWS:
        a = {s.info.name: s for s in split.tensors[view]}
        b = {s.info.name: s for s in whole.tensors[view]}
        assert sorted(a) == sorted(b)
        for name in a:
            assert a[name].steps.tolist() == b[name].steps.tolist() == [1, 2, 3, 4]
            for f in a[name].info.fields:
                x, y = a[name].field(f), b[name].field(f)
                if f in COUNTS:
                    np.testing.assert_array_equal(x, y, err_msg=f"{view} {name} {f}")
                elif not f.startswith(("ilr_", "update_ratio")) and f != "logq0":
                    # log10 magnitudes: absolute. Left out: the ratios of weight changes
                    # and the smallest magnitude (a value near zero is a difference of
                    # larger ones: its few ulps of rounding are a large share of it)
                    tol = (0, 1e-3) if f.startswith("logq") else (2e-4, 1e-6)
                    ok = [math.isclose(u, v, rel_tol=tol[0], abs_tol=tol[1])
                          or (math.isnan(u) and math.isnan(v)) for u, v in zip(x, y, strict=True)]
                    assert all(ok), (view, name, f, x, y)
