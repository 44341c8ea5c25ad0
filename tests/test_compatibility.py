"""Checkpoints written by lossscale 0.1.0 load into the current train cell and resume exactly.

The data in tests/data/release_0_1_0 was written by ``tests/release_checkpoint.py`` with the 0.1.0
release: a train cell saved mid-run, and what 0.1.0 did on the following calls. Loading the checkpoint
into a cell built by the current code must restore every Parameter and reproduce those calls bit for bit.
"""
import os

import mindspore as ms
import numpy as np
import pytest

from release_checkpoint import CONFIGS, SPLIT, STEPS, run_calls

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "release_0_1_0")


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_release_checkpoint_resumes_identically(name):
    build, injected = CONFIGS[name]
    expected = np.load(os.path.join(DATA, f"{name}.npz"))
    ms.set_seed(0)
    step = build()
    not_loaded, _ = ms.load_param_into_net(step, ms.load_checkpoint(os.path.join(DATA, f"{name}.ckpt")))
    assert not_loaded == []
    losses, flags, scales = run_calls(step, injected, SPLIT, STEPS)
    np.testing.assert_array_equal(losses, expected["losses"])
    assert flags == list(expected["flags"]) and scales == list(expected["scales"])
    counters = step.overflow_counters()
    assert [counters[k] for k in sorted(counters)] == list(expected["counters"])
    params = {p.name: p.asnumpy() for p in step.get_parameters()}
    for key in (k for k in expected.files if k.startswith("param:")):
        np.testing.assert_array_equal(params[key[len("param:"):]], expected[key], err_msg=key)
