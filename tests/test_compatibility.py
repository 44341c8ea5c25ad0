"""Checkpoints written by lossscale 0.1.0 load into the current train cell and resume as 0.1.0 did.

The data in tests/data/release_0_1_0 was written by ``tests/release_checkpoint.py`` with the 0.1.0
release: a train cell saved mid-run, and what 0.1.0 did on the following calls. Loading the checkpoint
into a cell built by the current code must restore every Parameter unchanged and make the same
decisions (overflow flags, scales, counters) on those calls.

Losses and weights are compared to 1e-6 relative, not bit for bit: CPU kernels round differently on
different processors (0.1.0 itself, rerun on an AMD EPYC without AVX-512, differs from the committed
data by up to 1.2e-7 in the weights, and is bit-identical to the current code there).
"""
import os

import mindspore as ms
import numpy as np
import pytest

from nets import snapshot
from release_checkpoint import CONFIGS, SPLIT, STEPS, run_calls

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "release_0_1_0")


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_release_checkpoint_resumes_identically(name):
    build, injected = CONFIGS[name]
    expected = np.load(os.path.join(DATA, f"{name}.npz"))
    saved = ms.load_checkpoint(os.path.join(DATA, f"{name}.ckpt"))
    ms.set_seed(0)
    step = build()
    not_loaded, unused = ms.load_param_into_net(step, saved)
    assert not_loaded == [] and unused == []
    loaded = snapshot(step)
    assert sorted(loaded) == sorted(saved)
    for key, value in saved.items():
        np.testing.assert_array_equal(loaded[key], value.asnumpy(), err_msg=key)
    losses, flags, scales = run_calls(step, injected, SPLIT, STEPS)
    assert flags == list(expected["flags"]) and scales == list(expected["scales"])
    counters = step.overflow_counters()
    assert [counters[k] for k in sorted(counters)] == list(expected["counters"])
    np.testing.assert_allclose(losses, expected["losses"], rtol=1e-6, atol=1e-8)
    params = snapshot(step)
    for key in (k for k in expected.files if k.startswith("param:")):
        np.testing.assert_allclose(params[key[len("param:"):]], expected[key], rtol=1e-6, atol=1e-7, err_msg=key)
