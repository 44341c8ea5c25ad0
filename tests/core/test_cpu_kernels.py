"""The command line's oneDNN limit (lossscale/_cpu_kernels.py): set unless the environment says otherwise, and it
reaches MindSpore's convolutions even when set after MindSpore is imported."""

import os
import subprocess
import sys

import pytest

from lossscale.core.compat import ONEDNN_ISA_VARIABLE, prefer_fast_cpu_convolutions
from lossscale.demo.cli import main


@pytest.mark.parametrize("before, after", [(None, "AVX2"), ("DEFAULT", "DEFAULT"), ("AVX512_CORE", "AVX512_CORE")])
def test_the_limit_is_avx2_unless_the_environment_sets_one(monkeypatch, before, after):
    if before is None:
        monkeypatch.delenv(ONEDNN_ISA_VARIABLE, raising=False)
    else:
        monkeypatch.setenv(ONEDNN_ISA_VARIABLE, before)
    prefer_fast_cpu_convolutions()
    assert os.environ[ONEDNN_ISA_VARIABLE] == after


def test_the_command_line_sets_the_limit_before_anything_else(monkeypatch, capsys):
    monkeypatch.delenv(ONEDNN_ISA_VARIABLE, raising=False)
    assert main(["--version"]) == 0
    capsys.readouterr()
    assert os.environ[ONEDNN_ISA_VARIABLE] == "AVX2"


_CONVOLUTION = """
import numpy as np
import mindspore as ms
from mindspore import Tensor
from lossscale.core.compat import prefer_fast_cpu_convolutions
from lossscale_models import LeNet5

ms.set_context(mode=ms.GRAPH_MODE)
prefer_fast_cpu_convolutions()  # after importing MindSpore, before its first operation (as the command line)
LeNet5()(Tensor(np.ones((32, 1, 32, 32), np.float32))).asnumpy()
"""


@pytest.mark.slow
def test_set_after_importing_mindspore_the_limit_reaches_its_convolutions():
    """oneDNN logs each kernel it runs (ONEDNN_VERBOSE): the convolutions are not the slow AVX-512 kernel for
    NCHW tensors (jit_uni_ncsp, about 25 times slower with MindSpore 2.10). On a CPU without AVX-512 oneDNN
    never picks it, so this checks something only on CPUs with AVX-512, as in CI."""
    env = {key: value for key, value in os.environ.items() if key != ONEDNN_ISA_VARIABLE}
    env.update(ONEDNN_VERBOSE="1", DNNL_VERBOSE="1")
    done = subprocess.run(
        [sys.executable, "-c", _CONVOLUTION], env=env, capture_output=True, text=True, timeout=300, check=True
    )
    convolutions = [line for line in done.stdout.splitlines() if ",exec,cpu,convolution," in line]
    assert convolutions, done.stdout[-2000:]
    assert not any("jit_uni_ncsp" in line for line in convolutions), convolutions
