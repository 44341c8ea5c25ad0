"""Automatic loss scaling (AutomaticLossScaleRule): the update against a plain-Python transcription of PopART's
algorithm with the overflow safety net, its measurement against NumPy, its refusals, and training with it through
the train cell, Model and LossScaleOptimizer (eagerly and compiled), which follow the rule step for step."""

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
import pytest
from grad_scaler_harness import scaled_grad_fn
from mindspore import Parameter, ParameterTuple, Tensor, mutable, nn, ops
from nets import StepRecorder, jit_if, slow_unless

from lossscale import (
    DynamicLossScaleManager,
    LossScaleOptimizer,
    LossScaleUpdateCell,
    Model,
    TrainOneStepWithLossScaleCell,
)
from lossscale.core._validation import FLOAT32_MAX
from lossscale.core.automatic import FLOAT16_MAX, AutomaticLossScaleRule
from lossscale.core.presets import get_preset
from lossscale.core.rule import advance, run
from lossscale.paddle import GradScaler as PaddleGradScaler
from lossscale.torch import GradScaler as TorchGradScaler

T, F = True, False


def transcribed(rule, steps):
    """The scale after each step of ``steps`` ((overflow, upper, values) each), written from PopART's
    LossScaleUpdateOp (``upper / values > threshold``: divide, else multiply, every update period) plus the safety
    net: an overflow divides at once and restarts the counts."""
    scale, count, upper, values, scales = rule.init_scale, 0, 0.0, 0.0, []
    for overflow, step_upper, step_values in steps:
        count, upper, values = count + 1, upper + step_upper, values + step_values
        if overflow or count == rule.update_period:
            down = overflow or upper / values > rule.threshold
            scale = max(scale / rule.factor, rule.min_scale) if down else min(scale * rule.factor, rule.max_scale)
            count, upper, values = 0, 0.0, 0.0
        scales.append(scale)
    return scales


# name -> (rule arguments, steps, the scales expected after each)
CASES = {
    "below_the_threshold": (dict(threshold=0.25), [(F, 0, 4)], [2048.0]),
    "at_the_threshold": (dict(threshold=0.25), [(F, 1, 4)], [2048.0]),
    "above_the_threshold": (dict(threshold=0.25), [(F, 2, 4)], [512.0]),
    "default_threshold_one_value_in_ten_million": (dict(), [(F, 1, 2 * 10**7), (F, 3, 10**7)], [2048.0, 1024.0]),
    "period_boundary_at": (
        dict(threshold=0.25, update_period=3),
        [(F, 0, 4), (F, 0, 4), (F, 3, 4)],
        [1024.0] * 2 + [2048.0],
    ),
    "period_boundary_above": (
        dict(threshold=0.25, update_period=3),
        [(F, 0, 4), (F, 4, 4), (F, 1, 4)],
        [1024.0] * 2 + [512.0],
    ),
    "overflow_mid_period": (
        dict(threshold=0.25, update_period=3),
        [(F, 4, 4), (T, 0, 4), (F, 0, 4), (F, 0, 4), (F, 0, 4)],
        [1024.0, 512.0, 512.0, 512.0, 1024.0],
    ),
    "floor": (dict(threshold=0.25, min_scale=512.0), [(F, 4, 4), (F, 4, 4), (T, 0, 4)], [512.0] * 3),
    "ceiling": (dict(max_scale=2048.0), [(F, 0, 4)] * 3, [2048.0] * 3),
    "factor_four": (dict(factor=4.0, threshold=0.25), [(F, 0, 4), (F, 2, 4), (T, 0, 4)], [4096.0, 1024.0, 256.0]),
    "edge_of_float32": (dict(init_scale=2.0**127, max_scale=FLOAT32_MAX), [(F, 0, 4)] * 2, [2.0**127] * 2),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_update_is_popart_with_the_overflow_safety_net(case):
    arguments, steps, expected = CASES[case]
    rule = AutomaticLossScaleRule(**{"init_scale": 1024.0, **arguments})
    trajectory = run(rule, [step[0] for step in steps], statistics=[step[1:] for step in steps])
    assert [state["scale"] for state in trajectory] == expected
    if case != "edge_of_float32":  # float32 holds 2**127 * 2 as inf: the transcription's float64 does not
        assert transcribed(rule, steps) == expected


def test_the_preset_is_popart_s_defaults():
    rule = get_preset("graphcore")
    assert (rule.bin_edge, rule.threshold, rule.update_period, rule.factor) == (0.0625, 1e-7, 1, 2.0)
    assert rule.settings()["edge"] == 4094.0 and get_preset("graphcore", window=5).update_period == 5


@pytest.mark.parametrize(
    "arguments, named",
    [
        (dict(bin_edge=0.0), "bin_edge"),
        (dict(bin_edge=1.5), "bin_edge"),
        (dict(bin_edge=float("nan")), "bin_edge"),
        (dict(threshold=-0.1), "threshold"),
        (dict(threshold=1.0), "threshold"),
        (dict(update_period=0), "update_period"),
        (dict(update_period=1.5), "update_period"),
        (dict(factor=1.0), "factor"),
        (dict(factor=float("inf")), "factor"),
        (dict(min_scale=0.0), "min_scale"),
        (dict(min_scale=8.0, max_scale=4.0, init_scale=8.0), "max_scale"),
        (dict(init_scale=2.0**30), "init_scale"),
        (dict(init_scale=0.5), "init_scale"),
    ],
)
def test_bad_arguments_are_refused_by_name(arguments, named):
    with pytest.raises((TypeError, ValueError), match=f"'{named}'"):
        AutomaticLossScaleRule(**arguments)


@pytest.mark.parametrize(
    "state, named",
    [
        (dict(period_steps=3), "period_steps"),
        (dict(upper=5.0, values=4.0), "upper"),
        (dict(values=-1.0), "values"),
        (dict(scale=2.0**30), "loss_scale"),
    ],
)
def test_a_loaded_state_is_checked_by_name(state, named):
    rule = AutomaticLossScaleRule(update_period=3)
    with pytest.raises(ValueError, match=named):
        rule.check_state(dict(rule.initial_state(), **state))


class _Measured(nn.Cell):
    def __init__(self, rule):
        super().__init__()
        self.rule, self.hyper_map = rule, ops.HyperMap()
        self.settings = tuple(Tensor(np.float32(value)) for value in rule.settings().values())

    def construct(self, grads, scale):
        return self.rule.measure(self.hyper_map, grads, scale, *self.settings)


def test_the_measure_counts_the_values_the_scale_puts_at_or_above_the_edge():
    """In buffers (small gradients, float16 too) and alone (large ones, float16 too, summed through a GEMV row); at
    the edge counts, just below it does not; inf counts."""
    rule = AutomaticLossScaleRule()
    scale = 1024.0
    edge = np.float32(0.0625 * FLOAT16_MAX) / np.float32(scale)  # unscaled values at or above this are counted
    rng = np.random.RandomState(0)
    arrays = [
        rng.randn(7).astype(np.float32),
        rng.randn(300, 300).astype(np.float32),
        rng.randn(3, 5).astype(np.float16),
        rng.randn(256, 300).astype(np.float16),
    ]
    arrays[0][:3] = [edge, np.nextafter(edge, np.float32(0)), -np.inf]
    arrays[1][0, :5] = 10.0
    arrays[1][1, :3] = [-edge, np.nextafter(edge, np.float32(0)), np.inf]
    arrays[2][0, 0] = -8.0
    arrays[3][5, :4] = [8.0, -edge, np.float16(np.nextafter(np.float16(edge), np.float16(0))), -np.inf]
    upper, values = _Measured(rule)(mutable(tuple(Tensor(a) for a in arrays)), Tensor(np.float32(scale)))
    expected = sum(int(np.sum(np.abs(a.astype(np.float32)) >= edge)) for a in arrays)
    assert (float(upper.asnumpy()), float(values.asnumpy())) == (expected, 7 + 90000 + 15 + 76800)
    assert expected >= 1 + 1 + 5 + 2 + 1 + 3


class _Linear(nn.Cell):
    """``sum(w_i * x)`` over ``parts`` weights: each gradient is ``x`` whatever the weights are, so a step's
    statistics are known beforehand. 16 parts: a compiled GradScaler step without a branch on the stage."""

    def __init__(self, parts=1):
        super().__init__()
        self.weights = ParameterTuple(Parameter(Tensor(np.ones(4, np.float32)), name=f"w{i}") for i in range(parts))

    def construct(self, x):
        loss = 0.0
        for w in self.weights:
            loss = loss + (w * x).sum()
        return loss


RULE = AutomaticLossScaleRule(init_scale=1024.0)
X = np.array([1.0, 1e-3, 1e-3, 1e-3], np.float32)  # 1.0 * S reaches the edge (4094) from S = 4096 on
FLAGS = [F, F, F, T, F, F, F]


def _expected():
    """The scale after each step of FLAGS, by the rule's own update fed with NumPy's counts."""
    state, scales = RULE.initial_state(), []
    for flag in FLAGS:
        upper = 0 if flag else int(np.sum(np.abs(X) * np.float32(state["scale"]) >= 4094.0))
        state = advance(RULE, state, flag, (upper, 4))
        scales.append(state["scale"])
    return scales


def _batches():
    return [np.array([np.inf, 1e-3, 1e-3, 1e-3], np.float32) if flag else X for flag in FLAGS]


def test_the_expected_schedule_climbs_to_the_edge_and_stays_below_it():
    assert _expected() == [2048.0, 4096.0, 2048.0, 1024.0, 2048.0, 4096.0, 2048.0]


def _train_cell(rule=RULE, **options):
    net = _Linear()
    return TrainOneStepWithLossScaleCell(net, nn.SGD(net.trainable_params(), 0.0), LossScaleUpdateCell(rule), **options)


def _trained(cell, batches):
    skipped, scales = [], []
    for x in batches:
        _, overflow, _ = cell(Tensor(x))
        skipped.append(bool(overflow.asnumpy()))
        scales.append(float(cell.scale_sense.asnumpy()))
    return skipped, scales


@pytest.mark.parametrize("clip", [pytest.param(None, marks=pytest.mark.slow), 1e-3], ids=["plain", "clipped"])
def test_train_cell_follows_the_rule(clip):
    """The counts are of the gradients before clipping (clipped to 1e-3, none would reach the edge)."""
    assert _trained(_train_cell(clip_global_norm=clip), _batches()) == (FLAGS, _expected())


def test_train_cell_resumes_from_its_checkpoint_step_for_step(tmp_path):
    rule = AutomaticLossScaleRule(init_scale=1024.0, update_period=2)
    whole = _trained(_train_cell(rule), _batches())
    first = _train_cell(rule)
    _trained(first, _batches()[:3])  # inside an update period: its counts are in the checkpoint
    ms.save_checkpoint(first, str(tmp_path / "als.ckpt"))
    resumed = _train_cell(AutomaticLossScaleRule(init_scale=1.0, update_period=2))
    ms.load_param_into_net(resumed, ms.load_checkpoint(str(tmp_path / "als.ckpt")))
    assert _trained(resumed, _batches()[3:]) == (whole[0][3:], whole[1][3:])


def test_model_follows_the_rule_through_a_manager():
    net = _Linear()
    manager = DynamicLossScaleManager.from_policy(RULE)
    model = Model(net, optimizer=nn.SGD(net.trainable_params(), 0.0), loss_scale_manager=manager)
    recorder = StepRecorder()
    model.train(1, ds.NumpySlicesDataset({"x": np.stack(_batches())}, shuffle=False).batch(1), callbacks=[recorder])
    assert recorder.rows == list(zip(FLAGS, _expected()))


@pytest.mark.parametrize(
    "compiled", [pytest.param(False, id="eager", marks=pytest.mark.slow), pytest.param(True, id="jit")]
)
def test_loss_scale_optimizer_follows_the_rule(compiled):
    net = _Linear()
    optimizer = LossScaleOptimizer(nn.SGD(net.trainable_params(), 0.0), policy=RULE)

    def scaled_loss(x):
        return optimizer.get_scaled_loss(net(x))

    grad_fn = ms.value_and_grad(scaled_loss, None, optimizer.parameters)

    def step(x):
        _, grads = grad_fn(x)
        return optimizer.apply_gradients(optimizer.get_unscaled_gradients(grads))

    step = jit_if(compiled, step)
    scales = []
    for x in _batches():
        step(Tensor(x))
        scales.append(float(optimizer.loss_scale.asnumpy()))
    assert scales == _expected()


SCALERS = {"torch": TorchGradScaler, "paddle": PaddleGradScaler}


def _grad_scaler_setup(spelling, rule, parts):
    """``(scaler, optimizer, grad_fn)``: a GradScaler of ``spelling`` with ``rule``, SGD(0) over ``_Linear(parts)``."""
    net = _Linear(parts)
    optimizer = nn.SGD(net.trainable_params(), 0.0)
    scaler = SCALERS[spelling](policy=rule)
    return scaler, optimizer, scaled_grad_fn(scaler, net, optimizer)


# The README's tier: each recipe once, eagerly and compiled, with and without the step's branch; the slow tier all.
GRAD_SCALER_CASES = [
    pytest.param(
        spelling,
        with_unscale,
        parts,
        compiled,
        id=f"{'jit' if compiled else 'eager'}-{spelling}-{'unscale_' if with_unscale else 'step'}-{parts}",
        marks=slow_unless((spelling, with_unscale, parts, compiled) in {("torch", True, 16, True)}),
    )
    for spelling in SCALERS
    for with_unscale in (False, True)
    for parts in (1, 16)
    for compiled in (False, True)
]


@pytest.mark.parametrize("spelling, with_unscale, parts, compiled", GRAD_SCALER_CASES)
def test_grad_scalers_follow_the_rule(spelling, with_unscale, parts, compiled):
    """Each gradient counts once per iteration: at unscale_(), or at the step() that unscales it."""
    scaler, optimizer, grad_fn = _grad_scaler_setup(spelling, RULE, parts)

    def step(x):
        _, grads = grad_fn(x)
        if with_unscale:
            grads = scaler.unscale_(grads)
        skipped = scaler.step(optimizer, grads)
        scaler.update()
        return skipped

    step = jit_if(compiled, step)
    skipped, scales = [], []
    for x in _batches():
        skipped.append(bool(step(Tensor(x)).asnumpy()))
        scales.append(scaler.get_scale())
    assert (skipped, scales) == (FLAGS, _expected())


@pytest.mark.parametrize(
    "spelling, parts, compiled",
    [
        pytest.param("torch", 16, True, id="jit-torch-16"),
        pytest.param("paddle", 1, False, id="eager-paddle-1", marks=pytest.mark.slow),
        pytest.param("paddle", 16, True, id="jit-paddle-16", marks=pytest.mark.slow),
        pytest.param("torch", 1, False, id="eager-torch-1", marks=pytest.mark.slow),
    ],
)
def test_a_gradient_counts_once_per_iteration_and_state_dicts_resume(spelling, parts, compiled):
    """unscale_() then step() counts the gradients once; a state dict saved inside an update period resumes."""
    rule = AutomaticLossScaleRule(init_scale=1024.0, update_period=3)
    scaler, optimizer, grad_fn = _grad_scaler_setup(spelling, rule, parts)

    def iteration(x):
        _, grads = grad_fn(x)
        scaler.step(optimizer, scaler.unscale_(grads))
        return scaler.update()

    jit_if(compiled, iteration)(Tensor(X))
    assert (scaler.get_state()["values"], scaler.get_state()["period_steps"]) == (4.0 * parts, 1)
    saved = scaler.state_dict()
    resumed = SCALERS[spelling](policy=AutomaticLossScaleRule(init_scale=1.0, update_period=3))
    resumed.load_state_dict(saved)
    assert resumed.get_state() == scaler.get_state()
