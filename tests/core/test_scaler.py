"""``LossScaler``, the core every front-end delegates to, tested directly: its graph methods eagerly and under
``mindspore.jit`` (one harness), and its host methods for each kind of thing that can hold the scale. Bad arguments
are in tests/test_bad_inputs.py; the backends' checks in tests/core/test_overflow.py."""

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn
from nets import jit_if
from user_rule import QuarterOnRepeat, transcribed

from lossscale import FixedLossScaleUpdateCell, LossScaleUpdateCell
from lossscale.core.policy import LossScalePolicy, run
from lossscale.core.scaler import LossScaler

# The scaled values themselves are tested here, outside any differentiation, which the core warns about eagerly.
pytestmark = pytest.mark.filterwarnings("ignore:A loss was scaled from Python outside")
T, F = True, False
INF, NAN = float("inf"), float("nan")


def _graph(compiled, method):
    """``method`` called eagerly or inside ``mindspore.jit`` (each case names its own method)."""
    return jit_if(compiled, method)


def test_scale_promotes_each_loss_and_keeps_the_container(compiled):
    core = LossScaler(2.0**20, name=f"scale_{compiled}")
    loss16, loss64 = Tensor(np.float16(3.0)), Tensor(np.float64(0.5))

    def scaled_tree(a, b):
        return core.scale([a, (b, a)])

    scaled = _graph(compiled, scaled_tree)(loss16, loss64)
    assert isinstance(scaled, list) and isinstance(scaled[1], tuple)
    assert [t.dtype for t in (scaled[0], scaled[1][0])] == [ms.float32, ms.float64]
    assert [float(t.asnumpy()) for t in (scaled[0], scaled[1][0], scaled[1][1])] == [3.0 * 2**20, 2.0**19, 3 * 2**20]


@pytest.mark.parametrize("loss, finite", [(2.0, True), (INF, False), (NAN, False)])
def test_a_loss_that_is_not_finite_scales_to_nan_and_flags(compiled, loss, finite):
    core = LossScaler(8.0, name=f"loss_flag_{compiled}_{finite}")

    def scaled_and_flag(x):
        return core.scale(x), core.loss_flag(x)

    scaled, flag = _graph(compiled, scaled_and_flag)(Tensor(np.float32(loss)))
    assert (float(scaled.asnumpy()) == loss * 8.0) == finite and np.isnan(float(scaled.asnumpy())) != finite
    assert (float(flag.asnumpy()) == 0.0) == finite


def test_sens_is_the_scale_in_the_loss_dtype_and_shape(compiled):
    core = LossScaler(2.0**10, name=f"sens_{compiled}")
    sens = _graph(compiled, core.sens)(Tensor(np.zeros((2, 3), np.float16)))
    assert (sens.dtype, sens.shape, float(sens.asnumpy()[1, 2])) == (ms.float16, (2, 3), 1024.0)


def test_unscale_is_exact_in_float32_and_keeps_each_dtype(compiled):
    """At S = 2**25, 1/S is 0 in float16 (MindSpore's cast of 1/S to the gradient's dtype); ours multiplies in
    float32 and casts back; a float64 gradient keeps float64's precision, None passes through."""
    core = LossScaler(2.0**25, name=f"unscale_{compiled}")
    grads = (Tensor(np.float16([2.0**12])), None, Tensor(np.float64([1.0 + 2.0**-40])))

    def unscaled(g16, g64):
        return core.unscale((g16, None, g64))

    g16, none, g64 = _graph(compiled, unscaled)(grads[0], grads[2])
    assert none is None and (g16.dtype, g64.dtype) == (ms.float16, ms.float64)
    assert float(g16.asnumpy()[0]) == 2.0**-13 and g64.asnumpy()[0] == (1.0 + 2.0**-40) / 2**25


@pytest.mark.parametrize(
    "values, overflow", [([1.0, -3.0], F), ([1.0, INF], T), ([NAN, 1.0], T), ([-INF, 0.0], T), ([6.0e4, 1e-8], F)]
)
def test_flag_and_decision_follow_the_gradients(compiled, values, overflow):
    core = LossScaler(1.0, name=f"flag_{compiled}")

    def decide(g):
        return core.is_overflow(core.flag(None, (g, -g)))

    assert bool(_graph(compiled, decide)(Tensor(np.float16(values))).asnumpy()) == overflow


FLAGS = [F, F, T, F, F, F, T, T, F, F]


@pytest.mark.parametrize(
    "rule, expected",
    [
        (
            LossScalePolicy(init_scale=2.0**10, growth_interval=2),
            [s.scale for s in run(LossScalePolicy(2.0**10, growth_interval=2), FLAGS)],
        ),
        (
            QuarterOnRepeat(init_scale=2.0**10, window=2, ceiling=2.0**12),
            transcribed(QuarterOnRepeat(2.0**10, 2, 2.0**12), FLAGS),
        ),
        (FixedLossScaleUpdateCell(64.0), [64.0] * len(FLAGS)),
        (
            ms.nn.DynamicLossScaleUpdateCell(2.0**10, 2, 2),
            [s.scale for s in run(LossScalePolicy(2.0**10, growth_interval=2), FLAGS)],
        ),
        (32.0, [32.0] * len(FLAGS)),
    ],
    ids=["policy", "user rule", "fixed cell", "mindspore cell", "number"],
)
def test_adjust_follows_what_holds_the_scale(compiled, rule, expected):
    core = LossScaler(rule, name=None if isinstance(rule, nn.Cell) else f"adjust_{compiled}_{type(rule).__name__}")

    def adjust(overflow):
        return core.adjust(overflow=overflow)

    step = _graph(compiled, adjust)
    scales = []
    for flag in FLAGS:
        assert bool(step(Tensor(flag)).asnumpy()) == flag
        scales.append(core.get_scale())
    assert scales == expected


@pytest.mark.parametrize(
    "rule, saved",
    [
        (
            LossScalePolicy(init_scale=8.0, growth_interval=4, hysteresis=2),
            {"loss_scale": 4.0, "good_steps": 3, "hysteresis_left": 1},
        ),
        (
            QuarterOnRepeat(init_scale=8.0, window=4, ceiling=64.0),
            {"loss_scale": 16.0, "clean_steps": 2, "overflows_in_a_row": 1},
        ),
        (8.0, {"loss_scale": 2.0}),
    ],
    ids=["policy", "user rule", "number"],
)
def test_state_dict_round_trip_and_a_refused_load_changes_nothing(rule, saved):
    core = LossScaler(rule, name=f"round_trip_{type(rule).__name__}")
    before = core.state_dict()
    bad = dict(saved, loss_scale=-1.0)
    with pytest.raises(ValueError, match="loss_scale"):
        core.load_state_dict(bad)
    assert core.state_dict() == before
    core.load_state_dict(saved)
    assert core.state_dict() == saved and core.get_scale() == saved["loss_scale"]


def test_set_scale_is_checked_against_the_rule_and_a_frozen_scale_never_changes():
    core = LossScaler(LossScalePolicy(init_scale=8.0, min_scale=2.0, max_scale=64.0), name="set_scale")
    core.set_scale(32.0)
    with pytest.raises(ValueError, match=r"\[2.0, 64.0\], but got 128.0"):
        core.set_scale(128.0)
    assert core.get_scale() == 32.0
    frozen = LossScaler(8.0, frozen=True)
    with pytest.raises(ValueError, match="frozen"):
        frozen.set_scale(4.0)
    assert (frozen.get_scale(), frozen.dynamic, frozen.rule) == (8.0, False, None)


def test_a_mutable_rule_changes_under_a_step_compiled_before():
    """``set_rule`` writes the settings Parameters (and the switch), so a step compiled before sees the change."""
    core = LossScaler(LossScalePolicy(init_scale=8.0, growth_interval=1), name="mutable", mutable_rule=True)

    @ms.jit
    def step(overflow):
        return core.adjust(overflow=overflow)

    step(Tensor(False))
    assert core.get_scale() == 16.0
    core.set_rule(LossScalePolicy(init_scale=16.0, growth_factor=4.0, growth_interval=1))
    step(Tensor(False))
    assert core.get_scale() == 64.0
    core.set_rule(dynamic=False)
    step(Tensor(True))
    assert (core.get_scale(), core.dynamic) == (64.0, False)
    fixed = LossScaler(LossScalePolicy(init_scale=8.0), name="immutable")
    with pytest.raises(RuntimeError, match="mutable"):
        fixed.set_rule(dynamic=False)


def test_parameter_names_follow_the_name_or_the_train_cell():
    rule = QuarterOnRepeat(init_scale=8.0)
    named = LossScaler(rule, name="mine")
    assert [p.name for p in named.get_parameters()] == ["mine.scale", "mine.clean_steps", "mine.overflows_in_a_row"]
    default = LossScaler(LossScaleUpdateCell(rule))
    assert [p.name for p in default.get_parameters()] == [
        "scale_sense",
        "loss_scale_clean_steps",
        "loss_scale_overflows_in_a_row",
    ]
