"""Checkpoints and state dicts written by lossscale 0.1.0 and 0.2.0 load and resume as those releases did.

The data in tests/data/release_0_1_0 and release_0_2_0 was written by ``tests/release_checkpoint.py`` with each
release: a train cell saved mid-run, and what the release did on the following calls. Loading the checkpoint
into a cell built by the current code must restore every Parameter unchanged and make the same
decisions (overflow flags, scales, counters) on those calls. ``tests/release_state.py`` wrote 0.2.0's front-end
state dicts (both GradScaler spellings, MindFormers' window, LossScaleOptimizer and its checkpoint) the same way.

Losses and weights are compared to 1e-6 relative, not bit for bit: CPU kernels round differently on
different processors (0.1.0 itself, rerun on an AMD EPYC without AVX-512, differs from the committed
data by up to 1.2e-7 in the weights, and is bit-identical to the current code there).

Also: every front-end compiles and trains identically under MindSpore's ``jit_syntax_level=STRICT``, and
trains eagerly in PyNative mode as compiled.
"""

import json
import os
import subprocess
import sys

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn
from nets import (
    TESTS,
    GradScalerRun,
    LossScaleOptimizerRun,
    reference_batches,
    reference_net,
    slow_unless,
    snapshot,
    tiered,
)
from release_checkpoint import CONFIGS, SPLIT, STEPS, run_calls
from release_state import CONFIGS as STATE_CONFIGS
from release_state import continue_run, from_json, front_end

from lossscale import DynamicLossScaleManager, GradScaler, TrainOneStepWithLossScaleCell

HERE = TESTS
RELEASES = {release: os.path.join(HERE, "data", f"release_{release}") for release in ("0_1_0", "0_2_0")}
RELEASE_CHECKPOINTS = [
    (release, name) for release, data in RELEASES.items() for name in sorted(CONFIGS)
    if os.path.exists(os.path.join(data, f"{name}.ckpt"))
]  # fmt: skip


# The README's tier: one configuration of each release; the slow tier all of them.
README_TIER_CHECKPOINTS = {("0_1_0", "dynamic_hysteresis_clip"), ("0_2_0", "adaptive_window")}


@pytest.mark.parametrize(
    "release, name",
    [
        pytest.param(r, n, id=f"{r}-{n}", marks=slow_unless((r, n) in README_TIER_CHECKPOINTS))
        for r, n in RELEASE_CHECKPOINTS
    ],
)
def test_release_checkpoint_resumes_identically(release, name):
    build, injected = CONFIGS[name]
    expected = np.load(os.path.join(RELEASES[release], f"{name}.npz"))
    saved = ms.load_checkpoint(os.path.join(RELEASES[release], f"{name}.ckpt"))
    ms.set_seed(0)
    step = build()
    not_loaded, unused = ms.load_param_into_net(step, saved)
    # The receivers of other configurations' state came after 0.1.0: absent from its checkpoint, left fresh.
    received = set(step.checkpoint_receiver.received())
    assert set(not_loaded) <= received and unused == []
    loaded = snapshot(step)
    assert set(saved) <= set(loaded) and set(loaded) - set(saved) <= received
    for key, value in saved.items():
        np.testing.assert_array_equal(loaded[key], value.asnumpy(), err_msg=key)
    losses, flags, scales = run_calls(step, injected, SPLIT, STEPS)
    assert flags == list(expected["flags"]) and scales == list(expected["scales"])
    counters = step.overflow_counters()
    assert [counters[k] for k in sorted(counters)] == list(expected["counters"])
    np.testing.assert_allclose(losses, expected["losses"], rtol=1e-6, atol=1e-8)
    params = snapshot(step)
    for key in (k for k in expected.files if k.startswith("param:")):
        np.testing.assert_allclose(params[key[len("param:") :]], expected[key], rtol=1e-6, atol=1e-7, err_msg=key)


@pytest.mark.parametrize("name", tiered(sorted(STATE_CONFIGS), {"torch_clip"}))
def test_release_front_end_state_resumes_identically(name):
    """0.2.0's state dict (and the LossScaleOptimizer's checkpoint, loaded first) into a front-end built by the
    current code, with the weights 0.2.0 had: the same skips and scales on the following iterations."""
    with open(os.path.join(RELEASES["0_2_0"], f"{name}.json")) as handle:
        record = json.load(handle)
    run = STATE_CONFIGS[name]()
    checkpoint = os.path.join(RELEASES["0_2_0"], f"{name}.ckpt")
    if os.path.exists(checkpoint):  # saved with 0.2.0's default name; here another wrapper may hold that one
        flag = next(p.name for p in run.optimizer.get_parameters() if p.name.endswith(".loss_scaled"))
        prefix = flag[: -len("loss_scaled")]
        saved = ms.load_checkpoint(checkpoint)
        saved = {key.replace("loss_scale_optimizer.weight.", prefix, 1): value for key, value in saved.items()}
        not_loaded, _ = ms.load_param_into_net(run.optimizer, saved)
        assert not_loaded == []
    front_end(run).load_state_dict({key: from_json(value) for key, value in record["state_dict"].items()})
    run.net.weight.set_data(Tensor(np.array(record["weight"], np.float32)))
    flags, scales, weight = continue_run(run)
    assert (flags, scales) == (record["flags"], record["scales"])
    np.testing.assert_allclose(weight, record["final_weight"], rtol=1e-6, atol=1e-7)


# ---- MindSpore's strict graph syntax ---------------------------------------------------------------------

STRICT_BATCHES = reference_batches(6, injected={2, 3})


def _train_cell_run():
    """The train cell on the reference model: ``(skip flags, scale, weight)`` after the batches."""
    net = reference_net()
    cell = TrainOneStepWithLossScaleCell(
        nn.WithLossCell(net, nn.MSELoss()),
        nn.SGD(net.trainable_params(), 0.05),
        DynamicLossScaleManager(2**10, scale_window=2).get_update_cell(),
    )
    flags = [bool(cell(Tensor(x), Tensor(y))[1].asnumpy()) for x, y in STRICT_BATCHES]
    return flags, cell.get_loss_scale(), net.weight.asnumpy().tolist()


def _front_end_run(front_end, compiled=True):
    """``front_end`` trained on the reference model (each skip checked against the injected batches), each
    step under ``mindspore.jit`` or called eagerly: ``(skip flags, scale, weight)``."""
    if front_end == "train_cell":
        return _train_cell_run()
    if front_end == "keras":
        run = LossScaleOptimizerRun(0.05, compiled, initial_scale=2.0**10, dynamic_growth_steps=2)
        scale = lambda: run.observed()["loss_scale"]  # noqa: E731
    else:
        scaler = (
            GradScaler("cpu", init_scale=2.0**10, growth_interval=2)
            if front_end == "torch"
            else GradScaler(init_loss_scaling=2.0**10, incr_every_n_steps=2)
        )
        run = GradScalerRun(scaler, clip=1.0, compiled=compiled)
        scale = scaler.get_scale
    flags = [run.checked_iteration(x, y, front_end) for x, y in STRICT_BATCHES]
    return flags, scale(), run.weight().tolist()


def _strict_mode_is_on():
    """Whether graphs compiled now use strict syntax (where a jit function cannot call ``Tensor.asnumpy``)."""

    @ms.jit
    def host_read(x):
        return Tensor(x.asnumpy())

    try:
        host_read(Tensor(np.ones(1, np.float32)))
    except AttributeError:
        return True
    return False


@pytest.mark.parametrize("front_end", tiered(["train_cell", "torch", "paddle", "keras"], {"torch"}))
def test_every_front_end_trains_the_same_in_strict_syntax_mode(front_end, monkeypatch):
    """MindSpore's strict graph syntax (no JIT Fallback; ``MS_DEV_JIT_SYNTAX_LEVEL=0``, which MindSpore 2.10
    reads at each compile, while its ``set_context(jit_syntax_level=...)`` no longer takes effect): the train
    cell, both GradScalers (with ``unscale_`` and clipping) and LossScaleOptimizer compile there and train
    exactly as in the default LAX mode (skips on the injected batches, scale, weights)."""
    runs = {}
    for level in ("0", "2"):
        monkeypatch.setenv("MS_DEV_JIT_SYNTAX_LEVEL", level)
        if _strict_mode_is_on() != (level == "0"):
            pytest.skip(f"MindSpore {ms.__version__} does not switch its syntax level within a process")
        runs[level] = _front_end_run(front_end)
    assert runs["0"][0] == [i in (2, 3) for i in range(len(STRICT_BATCHES))]
    assert runs["0"] == runs["2"]


@pytest.mark.parametrize("front_end", tiered(["torch", "paddle", "keras"], {"torch"}))
def test_every_front_end_called_eagerly_in_pynative_mode_trains_as_compiled(front_end):
    """PyNative is MindSpore's default mode (every other test runs in graph mode, see conftest.py): there the
    front-ends' Cells (the update cell, the state table) run op by op. The same skips, scale and weights as
    the compiled step (the train cell's own PyNative test is in test_train_cell.py)."""
    compiled = _front_end_run(front_end)
    ms.set_context(mode=ms.PYNATIVE_MODE)
    try:
        eager = _front_end_run(front_end, compiled=False)
    finally:
        ms.set_context(mode=ms.GRAPH_MODE)
    assert compiled[0] == [i in (2, 3) for i in range(len(STRICT_BATCHES))]
    assert eager == compiled


def _bytecode_run(front_end, mode):
    """``_front_end_run(front_end, compiled="bytecode")`` in context ``mode``, in a process of its own: after a
    bytecode-mode step in PyNative mode, a later graph in the same process that fails to compile hung MindSpore
    2.10's runtime (measured: test_recompiling_and_other_compiled_functions_never_raise run after it)."""
    code = (
        "import json, sys\n"
        f"sys.path[:0] = [{HERE!r}, {os.path.dirname(os.path.abspath(__file__))!r}]\n"
        "import mindspore as ms\n"
        f"ms.set_context(mode=ms.{mode})\n"
        "ms.set_device('CPU')\n"
        "import test_compatibility\n"
        f"print(json.dumps(test_compatibility._front_end_run({front_end!r}, compiled='bytecode')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    flags, scale, weight = json.loads(done.stdout.strip().splitlines()[-1])
    return flags, scale, weight


@pytest.mark.parametrize("front_end", ["torch", "paddle", "keras"])
@pytest.mark.parametrize("mode", ["GRAPH_MODE", "PYNATIVE_MODE"])
@pytest.mark.slow
def test_every_front_end_compiled_in_bytecode_mode_trains_as_in_ast_mode(front_end, mode):
    """``mindspore.jit(capture_mode="bytecode")``: both GradScalers (with ``unscale_`` and clipping) and
    LossScaleOptimizer (given the gradients alone) train exactly as under the default ``"ast"`` (skips on the
    injected batches, scale, weights), in either context mode. (A train cell or update cell called directly under
    it does not run in MindSpore 2.10: see quickstart.md.)"""
    flags, scale, weight = _front_end_run(front_end)
    assert flags == [i in (2, 3) for i in range(len(STRICT_BATCHES))]
    assert _bytecode_run(front_end, mode) == (flags, scale, weight)
