"""A rule written outside the library (tests/user_rule.py) runs everywhere a built-in rule runs: the pure update, an
update cell in the train cell and its checkpoints, Model through a manager, both GradScaler spellings and the
LossScaleOptimizer, eagerly and compiled, and their state dicts. Each follows the rule's plain-Python transcription
step for step and skips exactly the overflowing steps."""

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
import pytest
from grad_scaler_harness import MinimizeRun
from mindspore import nn
from nets import LossScaleOptimizerRun, StepRecorder, reference_batches, regression_net, slow_unless, with_inf
from train_cell_harness import BATCHES, run_cell, same_weights
from user_rule import QuarterOnRepeat, transcribed

from lossscale import (
    DynamicLossScaleManager,
    LossScaleOptimizer,
    LossScaleUpdateCell,
    Model,
    TrainOneStepWithLossScaleCell,
)
from lossscale.core.rule import run
from lossscale.paddle import GradScaler as PaddleGradScaler
from lossscale.torch import GradScaler as TorchGradScaler

T, F = True, False
RULE = QuarterOnRepeat(init_scale=2.0**10, window=2, ceiling=2.0**11)
FLAGS = [F, F, F, T, T, F, F, F, T, F, T, T, T, F, F]  # growth to the ceiling, halving, quartering, regrowth
SCALES = transcribed(RULE, FLAGS)
SPLIT = 7  # where the resumed runs save and load (between the overflow pairs)


def test_the_rule_is_its_transcription():
    assert [state["scale"] for state in run(RULE, FLAGS)] == SCALES
    assert SCALES[2] == 2.0**11 and 2.0**11 / 8 in SCALES  # the schedule reaches the ceiling and a quartering


def _cell(rule=RULE):
    net = regression_net()
    return TrainOneStepWithLossScaleCell(net, nn.Momentum(net.trainable_params(), 0.02, 0.9), LossScaleUpdateCell(rule))


def test_train_cell_follows_the_rule_and_resumes_from_its_checkpoint(tmp_path):
    inject = [step for step, flag in enumerate(FLAGS) if flag]
    batches = BATCHES * 2
    whole = _cell()
    assert run_cell(whole, batches[: len(FLAGS)], inject) == (FLAGS, SCALES)

    first = _cell()
    run_cell(first, batches[:SPLIT], inject)
    ms.save_checkpoint(first, str(tmp_path / "first.ckpt"))
    resumed = _cell(QuarterOnRepeat(init_scale=1.0, window=2, ceiling=2.0**11))  # the checkpoint sets the scale
    ms.load_param_into_net(resumed, ms.load_checkpoint(str(tmp_path / "first.ckpt")))
    rest = [step - SPLIT for step in inject if step >= SPLIT]
    assert run_cell(resumed, batches[SPLIT : len(FLAGS)], rest) == (FLAGS[SPLIT:], SCALES[SPLIT:])
    same_weights(whole, resumed)
    assert resumed.loss_scaling_manager.get_state() == run(RULE, FLAGS)[-1]


def test_model_trains_with_the_rule_through_a_manager():
    rng = np.random.RandomState(0)
    x, y = rng.randn(len(FLAGS) * 4, 6).astype(np.float32), rng.randn(len(FLAGS) * 4, 3).astype(np.float32)
    for step, flag in enumerate(FLAGS):
        if flag:
            x[step * 4] = with_inf(x[step * 4 : step * 4 + 1])[0]
    net = regression_net()  # with its loss
    manager = DynamicLossScaleManager.from_policy(RULE)
    model = Model(net, optimizer=nn.SGD(net.trainable_params(), 0.01), loss_scale_manager=manager)
    recorder = StepRecorder()
    model.train(1, ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(4), callbacks=[recorder])
    assert recorder.rows == list(zip(FLAGS, SCALES))
    assert manager.get_loss_scale() == SCALES[-1]


SCALERS = {"torch": TorchGradScaler, "paddle": PaddleGradScaler}


@pytest.mark.parametrize(
    "spelling, compiled",
    # the README's tier: each spelling once, one eager and one compiled
    [
        pytest.param(
            spelling,
            compiled,
            id=f"{spelling}-{'jit' if compiled else 'eager'}",
            marks=slow_unless((spelling == "torch") == compiled),
        )
        for spelling in sorted(SCALERS)
        for compiled in (True, False)
    ],
)
def test_grad_scalers_follow_the_rule_and_resume_from_their_state_dicts(spelling, compiled):
    first = MinimizeRun(SCALERS[spelling](policy=RULE), compiled)
    assert first.run(FLAGS[:SPLIT]) == SCALES[:SPLIT]
    saved = first.scaler.state_dict()
    assert saved == {"loss_scale": SCALES[SPLIT - 1], "clean_steps": 0, "overflows_in_a_row": 0}
    resumed = SCALERS[spelling](policy=RULE)
    resumed.load_state_dict(saved)
    assert MinimizeRun(resumed, compiled).run(FLAGS[SPLIT:]) == SCALES[SPLIT:]


@pytest.mark.parametrize("compiled", [True, pytest.param(False, marks=pytest.mark.slow)], ids=["jit", "eager"])
def test_loss_scale_optimizer_follows_the_rule_and_resumes_from_its_state_dict(compiled):
    injected = [step for step, flag in enumerate(FLAGS) if flag]
    batches = reference_batches(len(FLAGS), injected)
    first = LossScaleOptimizerRun(0.05, compiled, policy=RULE)
    scales = []
    for x, y in batches[:SPLIT]:
        first.checked_iteration(x, y)
        scales.append(first.observed()["loss_scale"])
    assert scales == SCALES[:SPLIT]
    resumed = LossScaleOptimizerRun(0.05, compiled, policy=RULE)
    resumed.optimizer.load_state_dict(first.optimizer.state_dict())
    for step, (x, y) in enumerate(batches[SPLIT:], SPLIT):
        resumed.checked_iteration(x, y)
        assert resumed.observed()["loss_scale"] == SCALES[step]


def test_what_a_rule_without_a_framework_view_cannot_say_reads_none():
    opt = LossScaleOptimizer(nn.SGD(regression_net().trainable_params(), 0.1), policy=RULE)
    assert opt.dynamic and opt.policy == RULE and float(opt.loss_scale.asnumpy()) == RULE.init_scale
    assert (opt.dynamic_growth_steps, opt.dynamic_counter) == (None, None)
    scaler = TorchGradScaler(policy=RULE)
    assert (scaler.get_scale(), scaler.get_growth_interval(), scaler.get_growth_factor()) == (
        RULE.init_scale,
        None,
        None,
    )
