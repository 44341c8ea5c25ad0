"""Shared test setup: MindSpore graph mode on CPU, and a driver cell for update cells."""

import os
import sys

import mindspore as ms
import numpy as np
import pytest
from hypothesis import settings
from mindspore import Parameter, Tensor, nn

from lossscale.core.compat import prefer_fast_cpu_convolutions

try:  # MindSpore >= 2.9 (mindspore.common.api is deprecated there)
    from mindspore.graph.api import _JitExecutor
except ImportError:
    from mindspore.common.api import _JitExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# Run by test_reference_keras.py and test_reference_jax.py under other interpreters (with TensorFlow, with JAX):
# not importable here.
collect_ignore = ["references/keras_reference.py", "references/jax_reference.py"]

# As the command line does (the results page is its output): fast CPU convolutions with MindSpore 2.10. The
# processes the tests start inherit it.
prefer_fast_cpu_convolutions()

# HYPOTHESIS_PROFILE=ci (set by .ci/run): the property tests draw the same examples on every run, so that CI's verdict
# depends on the change only; elsewhere they draw new ones each run (a failure prints how to reproduce it).
# No example database: the suite leaves no .hypothesis/ folder behind.
settings.register_profile("default", database=None)
settings.register_profile("ci", derandomize=True, database=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


class UpdateCellDriver(nn.Cell):
    """Owns a scale Parameter and calls an update cell with it, as a train cell does."""

    def __init__(self, update_cell, bind=True):
        super().__init__()
        self.update_cell = update_cell
        self.scale = Parameter(Tensor(np.float32(update_cell.get_loss_scale())), name="scale")
        if bind:
            update_cell.bind_scale_parameter(self.scale)

    def construct(self, overflow):
        return self.update_cell(self.scale, overflow)

    def run(self, overflows):
        """Feed each flag; return the scale after every step (host floats)."""
        scales = []
        for flag in overflows:
            self(Tensor(bool(flag)))
            scales.append(float(self.scale.asnumpy()))
        return scales


@pytest.fixture(params=[False, True], ids=["eager", "jit"])
def compiled(request):
    """A test taking ``compiled`` runs twice: eagerly, and under mindspore.jit (``nets.jit_if(compiled, step)``)."""
    return request.param


@pytest.fixture(autouse=True)
def _seed():
    ms.set_seed(0)
    np.random.seed(0)


@pytest.fixture
def compilations(monkeypatch):
    """A list that grows at each compilation of a ``mindspore.jit`` function or jit construct (MindSpore calls its
    recompilation check exactly when a call finds no compiled graph)."""
    module = sys.modules[_JitExecutor.__module__]
    compiled = []
    original = module._check_recompile

    def counting(*args, **kwargs):
        compiled.append(args[3] if len(args) > 3 else args)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, "_check_recompile", counting)
    return compiled
