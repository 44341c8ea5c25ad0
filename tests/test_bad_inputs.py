"""Every argument of every public constructor, swept with bad values: each is refused up front with a TypeError
or ValueError whose message names the argument (as the caller spelled it) and shows the value.

The values come from one table per kind of argument (a scale, a factor in (0, 1), a count, a flag, a choice),
crossed with every argument of that kind: types (None, str, bool, list), nan, +-inf, 0, negative, float32-tiny,
float32-huge, fractional counts, out-of-range counts. ``load_state_dict`` inputs are swept the same way.
Nothing that would train wrongly later is accepted.
"""

import dataclasses
import fractions
import json
import math
import re

import mindspore as ms
import numpy as np
import pytest
from mindspore import Parameter, Tensor, nn, ops
from nets import jit_if, regression_net

from conftest import UpdateCellDriver
from lossscale import (
    AdaptiveLossScaleManager,
    AdaptiveLossScaleUpdateCell,
    DynamicLossScaleManager,
    DynamicLossScaleUpdateCell,
    FixedLossScaleManager,
    FixedLossScaleUpdateCell,
    GradScaler,
    LossScaleMonitor,
    LossScaleOptimizer,
    LossScalePolicy,
    LossScaler,
    TorchGradScaler,
    TrainOneStepWithLossScaleCell,
    build_train_network,
    get_preset,
)
from lossscale.core import overflow
from lossscale.core._optimizers import check_optimizer_loss_scale
from lossscale.core.policy import LossScaleState
from lossscale.core.scaler import warn_if_scaled_outside_differentiation
from lossscale.frontends.optimizer_states import OptimizerStates
from lossscale.frontends.refusals import refuse_non_gradients

NAN, INF = float("nan"), float("inf")
WRONG_TYPES = [None, "1", True, [1.0]]
# Values that no scale accepts: not finite, not > 0, 0 in float32 (1e-46), infinite reciprocal (1e-45), > float32 max.
BAD_SCALES = WRONG_TYPES + [NAN, INF, -INF, 0.0, -1.0, 1e-46, 1e-45, 2.9e-39, 1e39]
BAD_GROWTH = WRONG_TYPES + [NAN, INF, 1.0, 0.5, 0.0, -2.0, 1.00000001, 1e39]
BAD_BACKOFF = WRONG_TYPES + [NAN, INF, 0.0, 1.0, 1.5, -0.5, 1e-50]
BAD_COUNTS = [None, "2", True, 1.5, [2], NAN, 0, -1, 2**31]
BAD_FLAGS = [None, "yes", 1, 0.0, "True"]
BAD_CHOICE = [None, 1, "bogus", True]


def _sweep(arguments):
    """``[(argument, value)]`` for ``arguments`` mapping a name to its table of bad values."""
    return [(name, value) for name, values in arguments.items() for value in values]


def _ids(cases):
    return [f"{name}={value!r}" for name, value in cases]


_STATED_RANGE = re.compile(r"in ([\[(])(-?[\d.e+-]+|-?inf), (-?[\d.e+-]+|-?inf)([\])])")


def _refused(call, name, value, shown=True):
    with pytest.raises((TypeError, ValueError)) as refused:
        call()
    message = str(refused.value)
    assert f"'{name}'" in message, message
    if shown and not isinstance(value, (list, Tensor)) and value is not None:
        spellings = {repr(value), str(value), type(value).__name__}
        if isinstance(value, float):
            spellings.add(f"{value:g}")
        assert any(text in message for text in spellings), message
    _assert_outside_stated_range(message, value)
    return message


def _assert_outside_stated_range(message, value):
    """A range the message states must exclude the refused number (a finite one: nan and inf are refused as
    not finite): "(0.0, 1.0]" for a refused 1.0 would tell the user 1.0 is allowed."""
    stated = _STATED_RANGE.search(message)
    if stated is None or isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return
    opening, low, high, closing = stated.group(1), float(stated.group(2)), float(stated.group(3)), stated.group(4)
    above_low = value >= low if opening == "[" else value > low
    below_high = value <= high if closing == "]" else value < high
    assert not (above_low and below_high), f"{value!r} refused, but the message allows it: {message}"


# ---- managers, update cells, policies ----------------------------------------------------------------

DYNAMIC_MANAGER = {
    "init_loss_scale": BAD_SCALES,
    "scale_factor": BAD_GROWTH,
    "scale_window": BAD_COUNTS,
    "backoff_factor": [v for v in BAD_BACKOFF if v is not None],
    "hysteresis": BAD_COUNTS,
    "consecutive_hysteresis": BAD_FLAGS,
    "refill_hysteresis_on_backoff": BAD_FLAGS,
    "min_loss_scale": WRONG_TYPES + [NAN, INF, -1.0],
    "max_loss_scale": [v for v in BAD_SCALES if v is not None],
}


@pytest.mark.parametrize("name, value", _sweep(DYNAMIC_MANAGER), ids=_ids(_sweep(DYNAMIC_MANAGER)))
def test_dynamic_manager_and_update_cell(name, value):
    _refused(lambda: DynamicLossScaleManager(**{name: value}), name, value)
    cell_name = "loss_scale_value" if name == "init_loss_scale" else name
    arguments = {"loss_scale_value": 1024.0, "scale_factor": 2, "scale_window": 100, cell_name: value}
    _refused(lambda: DynamicLossScaleUpdateCell(**arguments), cell_name, value)


# A rule field's own name where MindSpore spells it otherwise, or a misspelt extension: refused, never ignored.
UNKNOWN_KEYWORDS = [("init_scale", 8.0), ("growth_interval", 5), ("min_scale", 2.0), ("hysterisis", 2)]


@pytest.mark.parametrize("name, value", UNKNOWN_KEYWORDS, ids=[name for name, _ in UNKNOWN_KEYWORDS])
def test_dynamic_manager_and_update_cell_refuse_unknown_keywords(name, value):
    for build in (
        lambda: DynamicLossScaleManager(**{name: value}),
        lambda: DynamicLossScaleUpdateCell(8.0, 2, 5, **{name: value}),
    ):
        with pytest.raises(TypeError, match=f"unexpected keyword argument '{name}'"):
            build()


FIXED = {"loss_scale": [v for v in BAD_SCALES if v not in (None,)] + [0.5], "drop_overflow_update": BAD_FLAGS}


@pytest.mark.parametrize("name, value", _sweep(FIXED), ids=_ids(_sweep(FIXED)))
def test_fixed_manager(name, value):
    _refused(lambda: FixedLossScaleManager(**{name: value}), name, value)


@pytest.mark.parametrize("value", BAD_SCALES, ids=repr)
def test_fixed_update_cell(value):
    _refused(lambda: FixedLossScaleUpdateCell(value), "loss_scale_value", value)


BAD_OVERFLOW_FLAGS = [None, 1, 0, "no", 1.0, Tensor(np.float32(1.0)), Tensor(np.int32(0)), np.array([], np.bool_)]


@pytest.mark.parametrize("manager", [DynamicLossScaleManager, FixedLossScaleManager], ids=lambda m: m.__name__)
@pytest.mark.parametrize("overflow", BAD_OVERFLOW_FLAGS, ids=repr)
def test_manager_update_loss_scale_takes_a_bool_flag(manager, overflow):
    """MindSpore's managers read any truthy value as an overflow (1, "no") and None as a clean step; ours counted
    None as clean too and crashed on a string with NumPy's UFuncTypeError. A bool flag is needed, and nothing
    changes on a refusal."""
    made = manager(2.0**10) if manager is FixedLossScaleManager else manager(2.0**10, 2, 3)
    before = made.state_dict()
    with pytest.raises(TypeError, match="'overflow' must be a bool"):
        made.update_loss_scale(overflow)
    assert made.state_dict() == before
    for flag in (True, np.bool_(False), Tensor(True), np.array([True, False])):  # the last: not all overflowed
        made.update_loss_scale(flag)
    expected = 2.0**10 if manager is FixedLossScaleManager else 2.0**8  # backed off twice
    assert made.get_loss_scale() == expected


@pytest.mark.parametrize(
    "make",
    [lambda: DynamicLossScaleUpdateCell(8.0, 2, 10), lambda: FixedLossScaleUpdateCell(8.0)],
    ids=["dynamic", "fixed"],
)
@pytest.mark.parametrize(
    "overflow", [True, Tensor(np.float32(1.0)), Tensor(np.int32(0)), Tensor(np.array([True, False]))], ids=repr
)
@pytest.mark.slow
def test_update_cell_call_takes_one_bool_tensor(overflow, make, compiled):
    """cell(loss_scale, overflow): a Python bool, a float or int flag were MindSpore's "Failed calling Select" or
    "Select CPU operator ... Unsupported data type", a flag of two values an Assign's rank error; each is a TypeError
    naming 'overflow' while tracing, and the scale is untouched."""
    cell, scale = make(), Parameter(Tensor(np.float32(8.0)), name="update_cell_call_scale")

    def call(x):
        return x, cell(scale, overflow)

    with pytest.raises(TypeError, match="'overflow' must be a bool Tensor"):
        jit_if(compiled, call)(Tensor(np.float32(1.0)))
    assert scale.asnumpy() == 8.0
    cell(scale, Tensor(True))
    assert scale.asnumpy() == (4.0 if isinstance(cell, DynamicLossScaleUpdateCell) else 8.0)


UPDATE_CELL_HELPERS = {
    "bind_scale_parameter": [None, 3, np.float32(2.0), Parameter(np.ones(2, np.float32), "two")],
    "bind_micro_step": [None, 3, Parameter(np.zeros(3, np.int32), "three")],
    "rename_parameters": ["", "a b", 3, None],
    "read": ["bogus", 3, "init_scale"],
    "set_state": [None, {"loss_scale": 8.0}, (8.0, 0, 1)],
}


@pytest.mark.parametrize("method, value", _sweep(UPDATE_CELL_HELPERS), ids=_ids(_sweep(UPDATE_CELL_HELPERS)))
def test_update_cell_helpers_refuse_what_breaks_them_later(method, value):
    """Each of these was accepted and broke a later call (bind_scale_parameter(3): every get_state() an
    AttributeError; rename_parameters(""): Parameters named ".good_steps"), or raised a KeyError/AttributeError
    instead of naming the argument. Nothing changes on a refusal."""
    cell = DynamicLossScaleUpdateCell(8.0, 2, 10)
    names = [p.name for p in cell.get_parameters()]
    argument = {"rename_parameters": "prefix", "read": "name", "set_state": "state"}.get(method, "parameter")
    _refused(lambda: getattr(cell, method)(value), argument, value, shown=method in ("rename_parameters", "read"))
    assert [p.name for p in cell.get_parameters()] == names
    assert cell.state_dict() == {"loss_scale": 8.0, "good_steps": 0, "hysteresis_left": 1}
    assert not cell.window_open()


POLICY = {
    "init_scale": BAD_SCALES,
    "growth_factor": BAD_GROWTH,
    "backoff_factor": [v for v in BAD_BACKOFF if v is not None],
    "growth_interval": BAD_COUNTS,
    "hysteresis": BAD_COUNTS,
    "min_scale": WRONG_TYPES + [NAN, -1.0],
    "consecutive_hysteresis": BAD_FLAGS,
}


@pytest.mark.parametrize("name, value", _sweep(POLICY), ids=_ids(_sweep(POLICY)))
def test_policy_and_presets(name, value):
    _refused(lambda: LossScalePolicy(**{name: value}), name, value)
    _refused(lambda: get_preset("pytorch", **{name: value}), name, value)


@pytest.mark.parametrize("name", [None, 3, "tensorflow", "", ["pytorch"], {"pytorch": 1}], ids=repr)
def test_unknown_presets(name):
    _refused(lambda: get_preset(name), "preset", name, shown=name is not None)


# ---- bfloat16 Parameters on CPU ------------------------------------------------------------------------


def _bfloat16_regression():
    net = regression_net()
    for parameter in net.trainable_params():
        parameter.set_dtype(ms.bfloat16)
    return net


def _grad_scaler_step(net, optimizer, compiled):
    scaler = GradScaler("cpu")
    grads = tuple(Tensor(np.ones(parameter.shape, np.float32), ms.bfloat16) for parameter in optimizer.parameters)
    step = jit_if(compiled, scaler.step)
    return step(optimizer, grads)


BFLOAT16_CALLS = {
    "train cell": lambda net, opt: TrainOneStepWithLossScaleCell(net, opt, Tensor(np.float32(8.0))),
    "build_train_network": lambda net, opt: build_train_network(net, opt, loss_scale_manager=FixedLossScaleManager()),
    "LossScaleOptimizer": lambda net, opt: LossScaleOptimizer(opt),
    "GradScaler.step": lambda net, opt: _grad_scaler_step(net, opt, False),
    "GradScaler.step in jit": lambda net, opt: _grad_scaler_step(net, opt, True),
}


@pytest.mark.parametrize("call", BFLOAT16_CALLS.values(), ids=BFLOAT16_CALLS)
def test_bfloat16_parameters_are_refused_on_cpu_naming_the_device_and_dtype(call):
    """MindSpore has no bfloat16 Assign kernel on CPU: refused before anything runs, instead of failing inside
    MindSpore after the loss scaling did."""
    net = _bfloat16_regression()
    optimizer = nn.Optimizer(0.1, net.trainable_params())
    before = [parameter.asnumpy().copy() for parameter in net.trainable_params()]
    with pytest.raises(
        TypeError,
        match=r"updates bfloat16 Parameters \(4 of 4\), which cannot be trained on "
        r"device_target 'CPU'",
    ):
        call(net, optimizer)
    for parameter, value in zip(net.trainable_params(), before):
        np.testing.assert_array_equal(parameter.asnumpy(), value)


# ---- the train cell ----------------------------------------------------------------------------------


def _cell(**kwargs):
    net = regression_net()
    arguments = dict(network=net, optimizer=nn.SGD(net.trainable_params(), 0.1), scale_sense=Tensor(np.float32(8.0)))
    arguments.update(kwargs)
    return TrainOneStepWithLossScaleCell(
        arguments.pop("network"), arguments.pop("optimizer"), arguments.pop("scale_sense"), **arguments
    )


CELL = {
    "network": [None, "net", nn.SGD],
    "optimizer": [None, "sgd", nn.Dense(2, 1)],
    "scale_sense": [
        None,
        8.0,
        "8",
        Tensor(np.float32(np.inf)),
        Tensor(np.float32(0.0)),
        Tensor(np.float32(-2.0)),
        Tensor(np.float32(1e-45)),
        Tensor(True),
        Tensor(np.ones(2, np.float32)),
    ],
    "drop_overflow_update": BAD_FLAGS,
    "overflow_check": BAD_CHOICE[1:],
    "clip_global_norm": ["1", True, [1.0], NAN, INF, 0.0, -1.0],
    "accumulation_steps": BAD_COUNTS[1:],
    "overflow_policy": BAD_CHOICE,
    "debug_overflow": BAD_FLAGS,
    "extra_outputs": BAD_FLAGS,
    "lr_per_micro_batch": BAD_FLAGS,
}


@pytest.mark.parametrize("name, value", _sweep(CELL), ids=_ids(_sweep(CELL)))
def test_train_cell(name, value):
    _refused(lambda: _cell(**{name: value}), name, value, shown=not isinstance(value, (Tensor, nn.Cell, type)))


DYNAMIC_UPDATE_CELLS = {
    "lossscale": lambda: DynamicLossScaleUpdateCell(8.0, 2, 100),
    "adaptive": lambda: AdaptiveLossScaleUpdateCell(8.0, 2, 20),
    "mindspore": lambda: nn.DynamicLossScaleUpdateCell(8.0, 2, 100),
}


@pytest.mark.parametrize("make", DYNAMIC_UPDATE_CELLS.values(), ids=DYNAMIC_UPDATE_CELLS)
def test_applying_every_step_with_a_dynamic_rule_is_refused(make):
    """drop_overflow_update=False applies overflowing steps (the weights become inf) while the rule backs off for
    them: no use, so refused (a fixed scale applied every step is MindSpore's recipe)."""
    message = _refused(lambda: _cell(scale_sense=make(), drop_overflow_update=False), "drop_overflow_update", False)
    assert "FixedLossScaleManager(S, drop_overflow_update=False)" in message


@pytest.mark.parametrize(
    "given, advice",
    [
        (DynamicLossScaleManager(), r"Give the manager's update cell: manager.get_update_cell\(\)"),
        (1024.0, r"For a fixed scale give FixedLossScaleUpdateCell\(1024.0\) or Tensor\(1024.0, mindspore.float32\)"),
        (get_preset("pytorch"), r"For a rule give DynamicLossScaleUpdateCell.from_policy\(policy\)"),
    ],
    ids=["manager", "number", "rule"],
)
def test_a_scale_sense_of_another_kind_is_refused_saying_what_to_give(given, advice):
    with pytest.raises(TypeError, match=r"'scale_sense' must be an update Cell or a Tensor, but got \w+\. " + advice):
        _cell(scale_sense=given)


def test_an_update_cell_given_as_loss_scale_manager_is_refused_saying_what_to_give():
    from lossscale import Model

    net = nn.Dense(4, 2)
    cell = DynamicLossScaleUpdateCell(2.0, 2, 2)
    advice = r"but got DynamicLossScaleUpdateCell\. An update cell is what a manager makes: give the manager"
    with pytest.raises(TypeError, match=advice):
        Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.1), loss_scale_manager=cell)
    with pytest.raises(TypeError, match=advice):
        build_train_network(net, nn.SGD(net.trainable_params(), 0.1), nn.MSELoss(), loss_scale_manager=cell)


@pytest.mark.parametrize("value", ["3", True, 1.5, 0, -1], ids=repr)
def test_train_cell_max_consecutive_overflows(value):
    _refused(
        lambda: _cell(overflow_policy="raise", max_consecutive_overflows=value), "max_consecutive_overflows", value
    )


@pytest.mark.parametrize(
    "value",
    [
        8.0,
        Tensor(np.float32(np.nan)),
        Tensor(np.float32(0.0)),
        Tensor(np.float32(-1.0)),
        Tensor(np.float32(1e-45)),
        Tensor(np.ones(2, np.float32)),
        Tensor(True),
    ],
    ids=repr,
)
def test_set_sense_scale(value):
    _refused(lambda: _cell().set_sense_scale(value), "sens", value, shown=False)


# ---- build_train_network and Model -------------------------------------------------------------------

BUILD = {
    "level": [None, "O4", 2, "o2"],
    "boost_level": [None, "O3", 1],
    "cast_model_type": ["float16", None, np.float16, 16, ms.bfloat16],
    "keep_batchnorm_fp32": BAD_FLAGS,
    "loss_scale_manager": ["dynamic", 1024, DynamicLossScaleUpdateCell(2.0, 2, 2)],
    "clip_global_norm": [0.0, "1"],
    "accumulation_steps": [0, 1.5],
    "overflow_policy": ["explode", None],
    "max_consecutive_overflows": [0, 2.0],
    "debug_overflow": ["yes"],
    "overflow_check": ["tpu"],
    "extra_outputs": [1],
    "lr_per_micro_batch": ["no"],
}
BUILD_COMPANIONS = {"max_consecutive_overflows": {"overflow_policy": "raise"}}  # the limit exists only with "raise"


@pytest.mark.parametrize("name, value", _sweep(BUILD), ids=_ids(_sweep(BUILD)))
def test_build_train_network_and_model(name, value):
    """Refused by the builder, by Model with an optimizer (which builds the train cell in its __init__) and by
    Model without one (evaluation only: no train cell is built, but the options must not wait for a later Model)."""
    from lossscale import Model

    net = nn.Dense(4, 2)
    opt = nn.SGD(net.trainable_params(), 0.1)
    shown = not isinstance(value, (nn.Cell, type))
    kwargs = dict(BUILD_COMPANIONS.get(name, {}), **{name: value})
    _refused(lambda: build_train_network(net, opt, nn.MSELoss(), **kwargs), name, value, shown=shown)
    if name in ("level", "loss_scale_manager", "cast_model_type") or (name == "keep_batchnorm_fp32" and value is None):
        return  # MindSpore's Model checks these itself (it has no cast_model_type; None is its default)
    _refused(lambda: Model(net, nn.MSELoss(), opt, amp_level="O2", **kwargs), name, value, shown=shown)
    _refused(lambda: Model(net, nn.MSELoss(), metrics={"mae"}, **kwargs), name, value, shown=shown)


def test_build_train_network_without_a_network_or_optimizer():
    net = nn.Dense(4, 2)
    _refused(lambda: build_train_network(None, nn.SGD(net.trainable_params(), 0.1)), "network", None, shown=False)
    _refused(lambda: build_train_network(7, nn.SGD(net.trainable_params(), 0.1)), "network", 7)
    _refused(lambda: build_train_network(net, "sgd"), "optimizer", None, shown=False)


# ---- the core and the front-ends -------------------------------------------------------------------------

CORE = {
    "rule": [
        None,
        "1024",
        True,
        NAN,
        0.0,
        -1.0,
        1e-45,
        Tensor(np.ones(2, np.float32)),
        Tensor(np.ones((1, 1), np.float32)),
        nn.Dense(2, 1),
    ],
    "name": ["", "a b", 3],
    "overflow_check": BAD_CHOICE[1:],
    "mutable_rule": BAD_FLAGS,
    "frozen": BAD_FLAGS,
}


@pytest.mark.parametrize("name, value", _sweep(CORE), ids=_ids(_sweep(CORE)))
def test_loss_scaler(name, value):
    arguments = {"rule": 1024.0, name: value}
    shown = not isinstance(value, (Tensor, nn.Cell))
    with pytest.raises((TypeError, ValueError)) as refused:
        LossScaler(arguments.pop("rule"), **arguments)
    message = str(refused.value)
    assert f"'{name}'" in message, message  # 'scale_sense' or 'loss_scale' for 'rule' before
    if shown and name == "rule" and isinstance(value, float):
        assert f"{value!r}" in message or str(value) in message
    elif name == "rule" and not isinstance(value, (Tensor, nn.Cell)):  # what the rule may be, not only a number
        assert f"any LossScaleRule), an update Cell, a number or a Tensor, but got {type(value).__name__}." in message


@pytest.mark.parametrize(
    "overflow",
    [Tensor(np.float32(1.0)), Tensor(np.int32(1)), Tensor(np.array([True, False])) * 1.0, "yes", 1],
    ids=repr,
)
@pytest.mark.slow
def test_loss_scaler_adjust_takes_the_decision_only(overflow, compiled):
    """adjust(overflow) wants the decision (a bool Tensor: core.is_overflow(flag)) or a bool; a float flag given
    straight (which would skip the ranks' agreement) was MindSpore's "Select CPU operator ... Unsupported data
    type", a Python value its "Failed calling Select". Nothing changes on a refusal."""
    core = LossScaler(get_preset("pytorch", init_scale=8.0, growth_interval=1))

    def adjust(x):
        return x, core.adjust(overflow=overflow)

    with pytest.raises(TypeError, match="'overflow' must be a bool Tensor"):
        jit_if(compiled, adjust)(Tensor(np.float32(1.0)))
    assert core.state_dict() == {"loss_scale": 8.0, "good_steps": 0, "hysteresis_left": 1}
    core.adjust(overflow=True)
    core.adjust(overflow=Tensor(False))
    core.adjust(overflow=np.bool_(False))
    assert core.get_scale() == 16.0  # backed off to 4, then grew after each clean step


@pytest.mark.parametrize(
    "call, got",
    [
        ("positional", "1 positional argument"),
        ("positional_and_keyword", "1 positional argument"),
        ("missing", "no decision"),
        ("None", "no decision"),
    ],
    ids=["positional", "positional_and_keyword", "missing", "None"],
)
def test_loss_scaler_adjust_takes_the_decision_by_keyword_only(call, got, compiled):
    """jmp's and mindspore.amp.DynamicLossScaler's adjust(grads_finite) take the opposite polarity of the core's
    adjust(overflow): the habit core.adjust(ms.amp.all_finite(grads)) backed the scale off on every clean step and
    grew it on every overflow, silently (the scale went from 8 to 2 in two clean steps). The decision is now
    keyword-only; a positional one, or none (None), is a TypeError that says which way round it goes, while tracing,
    and nothing changes."""
    core = LossScaler(get_preset("mindspore", init_scale=8.0, growth_interval=1), name=f"adjust_{call}_{compiled}")

    def adjust(grads):
        finite = ms.amp.all_finite(grads)
        if call == "positional":
            return core.adjust(finite)
        if call == "positional_and_keyword":
            return core.adjust(finite, overflow=ops.logical_not(finite))
        return core.adjust() if call == "missing" else core.adjust(overflow=None)

    grads = (Tensor(np.ones(2, np.float32)),)
    with pytest.raises(TypeError, match=rf"adjust\(overflow=\.\.\.\).*but got {got}.*opposite.*logical_not"):
        jit_if(compiled, adjust)(grads)
    assert core.state_dict() == {"loss_scale": 8.0, "good_steps": 0, "hysteresis_left": 1}
    core.adjust(overflow=ops.logical_not(ms.amp.all_finite(grads)))  # the translation the message gives
    assert core.get_scale() == 16.0


BOUNDED_RULE = LossScalePolicy(init_scale=8.0, min_scale=2.0, max_scale=16.0)
CORE_SETTINGS = {
    "set_scale": BAD_SCALES + [32.0, 1.0, Tensor(np.array([4.0, 8.0], np.float32))],
    "set_rule": [("rule", "pytorch"), ("rule", 2.0**16), ("dynamic", "no"), ("dynamic", 1), ("dynamic", None)],
}


@pytest.mark.parametrize("method, value", _sweep(CORE_SETTINGS), ids=_ids(_sweep(CORE_SETTINGS)))
def test_loss_scaler_settings_are_checked_and_change_nothing(method, value):
    """The core's host setters: a scale outside a dynamic rule's [min, max] (a state its own load_state_dict would
    then refuse) was written; set_rule(dynamic="no") turned the rule on (truthy), set_rule(rule="pytorch") was an
    AttributeError. A None switch is a refusal too, once it reaches the update cell."""
    core = LossScaler(BOUNDED_RULE, name="settings_checked", mutable_rule=True)
    before = core.state_dict()
    if method == "set_scale":
        _refused(lambda: core.set_scale(value), "scale", value)
    else:
        argument, bad = value
        call = {"rule": lambda: core.set_rule(rule=bad), "dynamic": lambda: core.update_cell.set_dynamic(bad)}[argument]
        _refused(call, argument, bad)
        if argument == "dynamic" and bad is not None:
            _refused(lambda: core.set_rule(dynamic=bad), argument, bad)
            _refused(lambda: DynamicLossScaleUpdateCell(8.0, 2, 10, mutable_rule=True).set_dynamic(bad), argument, bad)
    assert core.state_dict() == before and core.dynamic


def test_loss_scaler_scale_set_within_the_rule_loads_back():
    core = LossScaler(BOUNDED_RULE, name="settings_round_trip")
    for value in (2.0, 16.0, Tensor(np.float32(4.0))):
        core.set_scale(value)
        other = LossScaler(BOUNDED_RULE, name="settings_round_trip_other")
        other.load_state_dict(core.state_dict())
        assert (
            other.state_dict()
            == core.state_dict()
            == {"loss_scale": float(value), "good_steps": 0, "hysteresis_left": 1}
        )


def test_a_fixed_scale_core_takes_the_decision_only_too(compiled):
    """A fixed scale has no update cell to check the flag: the core checks it itself (a float flag passed)."""
    core = LossScaler(8.0, name=f"fixed_adjust_{compiled}")

    def adjust(flag):
        return core.adjust(overflow=flag)

    with pytest.raises(TypeError, match="'overflow' must be a bool Tensor"):
        jit_if(compiled, adjust)(Tensor(np.float32(1.0)))
    assert bool(adjust(Tensor(True)).asnumpy()) and core.get_scale() == 8.0


def test_a_frozen_scale_is_fixed_and_cannot_be_set():
    """A frozen scale (the train cell's, when the optimizer divides by it itself) is a graph constant."""
    _refused(lambda: LossScaler(get_preset("pytorch"), frozen=True), "frozen", None, shown=False)
    core = LossScaler(8.0, frozen=True)
    with pytest.raises(ValueError, match="frozen"):
        core.set_scale(4.0)
    assert core.get_scale() == 8.0 and not list(core.get_parameters())  # a constant of the graph, no Parameter


@pytest.mark.parametrize("frozen", [True, False], ids=["frozen", "parameter"])
def test_what_a_loss_scaler_compiles_cannot_be_reassigned(frozen):
    """`core.frozen = False` on a frozen core was accepted: set_scale() then wrote the host's copy of the constant
    and get_scale() reported it, while compiled steps kept the constant; `core.frozen = True` made get_scale()
    report the initial scale for good. `core.is_distributed` decides whether the flag is all-reduced."""
    core = LossScaler(8.0, frozen=frozen)
    with pytest.raises(AttributeError, match="LossScaler.frozen cannot be assigned: .* build a new LossScaler"):
        core.frozen = not frozen
    with pytest.raises(AttributeError, match="LossScaler.is_distributed cannot be assigned: the all-reduce"):
        core.is_distributed = True
    assert (core.frozen, core.is_distributed) == (frozen, False)
    if frozen:
        with pytest.raises(ValueError, match="frozen"):
            core.set_scale(4.0)
    else:
        core.set_scale(4.0)
    assert core.get_scale() == (8.0 if frozen else 4.0)


def test_loss_scaler_set_rule_takes_a_state_alone():
    """set_rule(state=...) keeps the rule (it passed None on as the policy: a TypeError)."""
    core = LossScaler(BOUNDED_RULE, name="settings_state_alone", mutable_rule=True)
    core.set_rule(state=LossScaleState(scale=4.0, good_steps=0, hysteresis_left=1))
    assert core.state_dict() == {"loss_scale": 4.0, "good_steps": 0, "hysteresis_left": 1}
    assert core.rule == BOUNDED_RULE


def test_loss_scaler_around_mindspores_own_update_cells_saves_and_loads_their_state():
    """MindSpore's dynamic update cell keeps step numbers: the core reports its clean steps in a row as
    good_steps and restores them (the next growth comes as it would have), checked against its window; its fixed
    update cell's state must hold its scale."""
    core = LossScaler(nn.DynamicLossScaleUpdateCell(8.0, 2, 3), name="mindspore_dynamic_state")
    assert core.dynamic and core.state_dict() == {"loss_scale": 8.0, "good_steps": 0}
    core.adjust(overflow=False)
    assert core.state_dict() == {"loss_scale": 8.0, "good_steps": 1}
    core.load_state_dict({"loss_scale": 4.0, "good_steps": 2})
    assert core.state_dict() == {"loss_scale": 4.0, "good_steps": 2}
    core.adjust(overflow=False)
    assert core.state_dict() == {"loss_scale": 8.0, "good_steps": 0}
    _refused(lambda: core.load_state_dict({"loss_scale": 4.0, "good_steps": 3}), "good_steps", 3)
    _refused(lambda: core.load_state_dict({"loss_scale": -1.0, "good_steps": 1}), "state_dict['loss_scale']", -1.0)
    assert core.state_dict() == {"loss_scale": 8.0, "good_steps": 0}
    core.load_state_dict({"loss_scale": 4.0, "good_steps": 0})  # the lowest count, as after a growth
    assert core.state_dict() == {"loss_scale": 4.0, "good_steps": 0}
    core.adjust(overflow=False)
    core.load_state_dict({"loss_scale": 2.0})  # a state of the scale only (0.1.0's) keeps the count
    assert core.state_dict() == {"loss_scale": 2.0, "good_steps": 1}
    fixed = LossScaler(nn.FixedLossScaleUpdateCell(8.0), name="mindspore_fixed_state")
    assert not fixed.dynamic
    fixed.load_state_dict({"loss_scale": 8.0})
    _refused(lambda: fixed.load_state_dict({"loss_scale": 4.0}), "loss_scale", 4.0)


@pytest.mark.parametrize("frozen", [False, True], ids=["parameter", "frozen"])
def test_loss_scaler_of_a_number_saves_and_loads_its_scale(frozen):
    """A fixed scale given as a number has no update cell: its state is the scale alone, loading writes it (adjust
    then keeps it), and a bad or missing scale is refused naming the key, with nothing changed. A frozen one (a
    graph constant) loads only its own scale, as a fixed update cell."""
    core = LossScaler(8.0, frozen=frozen)
    assert core.state_dict() == {"loss_scale": 8.0}
    bad = [{"loss_scale": -1.0}, {"loss_scale": math.inf}, {}, {"loss_scale": "8"}] + ([{"loss_scale": 4.0}] * frozen)
    for state in bad:
        with pytest.raises((TypeError, ValueError), match=r"'state_dict(\['loss_scale'\])?' (must|is missing)"):
            core.load_state_dict(state)
        assert core.state_dict() == {"loss_scale": 8.0}
    loaded = 8.0 if frozen else 4.0
    core.load_state_dict({"loss_scale": loaded})
    assert core.state_dict() == {"loss_scale": loaded}
    assert bool(core.adjust(overflow=Tensor(True)).asnumpy()) and core.state_dict() == {"loss_scale": loaded}


_GRADIENT = Tensor(np.ones(2, np.float32))


@pytest.mark.parametrize(
    "grads, error, pattern",
    [
        ((), ValueError, "'grads' holds no gradients"),
        ([], ValueError, "'grads' holds no gradients"),
        (_GRADIENT, TypeError, "'grads' must be a tuple or list of gradients.*but got a single Tensor"),
        (nn.Dense(1, 1), TypeError, r"'grads' must be a tuple or list of gradients.*but got a Cell \(an optimizer\?\)"),
        (
            {"w": _GRADIENT},
            TypeError,
            r"'grads' must be a tuple or list of gradients, one per parameter of the optimizer "
            r"\(what mindspore.value_and_grad returns for them\)\.$",
        ),
        ((np.ones(2, np.float32),), TypeError, r"'grads\[0\]' must be a gradient Tensor, but got ndarray"),
        ((_GRADIENT, np.float32(1.0)), TypeError, r"'grads\[1\]' must be a gradient Tensor"),
        ((_GRADIENT, 1.0), TypeError, r"'grads\[1\]' must be a gradient Tensor, but got float"),
        # Nested one level too deep, in each container and at the length of a RowTensor's tuple:
        ((_GRADIENT, (_GRADIENT,) * 3), TypeError, r"'grads\[1\]' must be a gradient Tensor, but got a tuple: give"),
        ([_GRADIENT, [_GRADIENT] * 3], TypeError, r"'grads\[1\]' must be a gradient Tensor, but got a list: give"),
        ((_GRADIENT, (_GRADIENT, _GRADIENT, (2,))), TypeError, r"'grads\[1\]' is a sparse gradient \(RowTensor"),
        (
            (_GRADIENT, [_GRADIENT, _GRADIENT, (2,)]),
            TypeError,
            r"'grads\[1\]' must be a gradient Tensor, but got a list",
        ),
        ((_GRADIENT, (_GRADIENT, 1, (2,))), TypeError, r"'grads\[1\]' must be a gradient Tensor, but got a tuple"),
    ],
    ids=[
        "empty",
        "empty_list",
        "tensor",
        "cell",
        "dict",
        "ndarray",
        "numpy_scalar",
        "float",
        "nested_tuple_of_3",
        "nested_list_of_3",
        "row_tensor_tuple",
        "row_tensor_as_list",
        "row_tensor_tuple_without_values",
    ],
)
def test_what_is_given_where_the_gradients_go(grads, error, pattern):
    """Each kind of wrong argument gets its own message, naming the argument (and the entry)."""
    with pytest.raises(error, match=pattern):
        refuse_non_gradients(grads, "grads")


@pytest.mark.parametrize(
    "optimizer_scale, fixed_scale, expected",
    [
        (1.0, None, False),  # the optimizer does not divide: lossscale unscales
        (1.0, 8.0, False),
        (8.0, 8.0, True),  # MindSpore's FixedLossScaleManager(8, drop_overflow_update=False) recipe
        (8.0, np.float32(8.0), True),
        (8.0, None, "'optimizer.loss_scale' is 8.0 but the loss scale is dynamic"),
        (8.0, 4.0, "'optimizer.loss_scale' is 8.0 but the loss scale is 4.0"),
        (8.0, 1.0, "'optimizer.loss_scale' is 8.0 but the loss scale is 1.0"),
    ],
    ids=["plain_dynamic", "plain_fixed", "same_fixed", "same_fixed_float32", "dynamic", "other_fixed", "fixed_one"],
)
def test_an_optimizer_that_divides_by_its_own_loss_scale(optimizer_scale, fixed_scale, expected):
    """Accepted only where it divides by exactly the fixed scale applied every step (True: the optimizer unscales);
    anywhere else the gradients would be unscaled twice or by the wrong factor: a ValueError naming both."""
    optimizer = nn.SGD(nn.Dense(1, 1).trainable_params(), 0.1, loss_scale=optimizer_scale)
    if isinstance(expected, bool):
        assert check_optimizer_loss_scale(optimizer, fixed_scale) is expected
    else:
        with pytest.raises(ValueError, match=re.escape(expected) + ": the gradients would be unscaled twice"):
            check_optimizer_loss_scale(optimizer, fixed_scale)


@pytest.mark.parametrize(
    "grads",
    [(_GRADIENT,), [_GRADIENT, None], (_GRADIENT, _GRADIENT, _GRADIENT)],
    ids=["one", "list_with_none", "three"],
)
def test_gradients_where_the_gradients_go_pass(grads):
    assert refuse_non_gradients(grads, "grads") is True


@pytest.mark.parametrize("anchor", [None, 1.0, Tensor(np.float32(1.0)), np.float32(1.0)], ids=repr)
def test_the_scaling_warning_needs_a_parameter_anchor(anchor):
    """A constant anchor cannot tell Python from a compiled function (inside a graph it would run the host check)."""
    _refused(lambda: warn_if_scaled_outside_differentiation(anchor), "anchor", anchor, shown=False)


CHECK_PRIMITIVES = [
    ("FloatStatusCheck", "float_status"),
    ("AllFiniteCheck", "all_finite"),
    ("AscendSaturationCheck", "clear_status"),
    ("AscendSaturationCheck", "get_status"),
]


@pytest.mark.parametrize("check, argument", CHECK_PRIMITIVES, ids=[f"{c}-{a}" for c, a in CHECK_PRIMITIVES])
@pytest.mark.parametrize("value", [3, "FloatStatus", Tensor(np.float32(1.0))], ids=repr)
def test_backend_checks_take_callable_primitives(check, argument, value):
    """A stand-in that cannot be called was accepted and failed only while tracing the first step."""
    _refused(lambda: getattr(overflow, check)(**{argument: value}), argument, value, shown=False)


@pytest.mark.parametrize("value", ["yes", 1, None], ids=repr)
def test_choose_overflow_check_takes_a_bool_saturation_flag(value):
    """A truthy 'yes' chose the saturation check."""
    _refused(
        lambda: overflow.choose_overflow_check("Ascend", ascend_saturation_only=value), "ascend_saturation_only", value
    )


OPTIMIZER_STATES = {"name": ["", "a b", 3, None], "capacity": BAD_COUNTS}


@pytest.mark.parametrize("name, value", _sweep(OPTIMIZER_STATES), ids=_ids(_sweep(OPTIMIZER_STATES)))
def test_optimizer_states(name, value):
    arguments = {"name": "states", name: value}
    _refused(lambda: OptimizerStates(**arguments), name, value, shown=name == "capacity")


GRAD_SCALER = {
    "enable": BAD_FLAGS,
    "init_loss_scaling": BAD_SCALES,
    "incr_ratio": BAD_GROWTH,
    "decr_ratio": BAD_BACKOFF,
    "incr_every_n_steps": BAD_COUNTS,
    "decr_every_n_nan_or_inf": BAD_COUNTS,
    "use_dynamic_loss_scaling": BAD_FLAGS,
}
TORCH_SCALER = {
    "init_scale": BAD_SCALES,
    "growth_factor": BAD_GROWTH,
    "backoff_factor": BAD_BACKOFF,
    "growth_interval": BAD_COUNTS,
    "enabled": BAD_FLAGS,
}


@pytest.mark.parametrize(
    "name, value", _sweep(GRAD_SCALER) + _sweep(TORCH_SCALER), ids=_ids(_sweep(GRAD_SCALER) + _sweep(TORCH_SCALER))
)
def test_grad_scalers(name, value):
    _refused(lambda: GradScaler(**{name: value}), name, value)


BACKOFF_ARGUMENTS = [
    (LossScalePolicy, "backoff_factor"),
    (DynamicLossScaleManager, "backoff_factor"),
    (GradScaler, "decr_ratio"),
    (GradScaler, "backoff_factor"),
]


@pytest.mark.parametrize("make, name", BACKOFF_ARGUMENTS, ids=[f"{m.__name__}-{n}" for m, n in BACKOFF_ARGUMENTS])
def test_every_refused_backoff_states_the_open_range(make, name):
    """A factor in (0, 1) is refused with that range whatever the value: a refused 0.0 was told "(0.0, 1.0]",
    which says 1.0 would do (1.0 itself was told "(0.0, 1.0)")."""
    for value in (0.0, 1.0, 1.5, -0.5):
        message = _refused(lambda: make(**{name: value}), name, value)
        assert "in (0.0, 1.0), but got" in message, message


KERAS = {
    "dynamic": BAD_FLAGS,
    "initial_scale": BAD_SCALES[1:],
    "dynamic_growth_steps": BAD_COUNTS[1:],
    "policy": [3, 2.0, True, "bogus", {"init_scale": 8.0}],
}


@pytest.mark.parametrize("name, value", _sweep(KERAS), ids=_ids(_sweep(KERAS)))
def test_loss_scale_optimizer(name, value):
    optimizer = nn.SGD(nn.Dense(2, 1).trainable_params(), 0.1)
    with pytest.raises(ValueError) as refused:  # Keras raises ValueError for every invalid argument
        LossScaleOptimizer(optimizer, **{name: value})
    assert name in str(refused.value)


# MindFormers' adaptive window, by the manager's names (the initial scale is the cell's loss_scale_value, the rule's
# and the presets' init_scale). A scale below 1, a window that int32 cannot hold, a factor of 1 in float32.
ADAPTIVE = {
    "init_loss_scale": BAD_SCALES + [0.5],
    "scale_factor": BAD_GROWTH,
    "scale_window": [None, "20", True, 1.5, -1, 2**31],
    "max_scale_window": BAD_COUNTS,
    "min_scale_window": BAD_COUNTS,
}
ADAPTIVE_BUILDERS = {
    "manager": ("init_loss_scale", lambda **arguments: AdaptiveLossScaleManager(**arguments)),
    "update_cell": (
        "loss_scale_value",
        lambda **arguments: AdaptiveLossScaleUpdateCell(
            **dict(dict(loss_scale_value=8.0, scale_factor=2, scale_window=20), **arguments)
        ),
    ),
    "get_preset": ("init_scale", lambda **arguments: get_preset("mindformers", **arguments)),
    "from_preset": ("init_scale", lambda **arguments: TorchGradScaler.from_preset("mindformers", **arguments)),
}


@pytest.mark.parametrize("builder", ADAPTIVE_BUILDERS)
@pytest.mark.parametrize("name, value", _sweep(ADAPTIVE), ids=_ids(_sweep(ADAPTIVE)))
def test_adaptive_window(builder, name, value):
    init_name, build = ADAPTIVE_BUILDERS[builder]
    name = init_name if name == "init_loss_scale" else name
    _refused(lambda: build(**{name: value}), name, value)


def test_adaptive_numbers_of_other_types_are_the_floats_they_stand_for():
    """A Fraction (or NumPy) factor is the float it stands for: MindSpore's Tensor constructor took no Fraction."""
    cell = AdaptiveLossScaleUpdateCell(np.float64(1024), fractions.Fraction(4, 1), 20)
    assert (cell.rule.init_scale, cell.rule.scale_factor, cell.read("backoff_factor")) == (1024.0, 4.0, 0.25)
    assert UpdateCellDriver(cell).run([True, False]) == [256.0, 256.0]


MONITOR = {"csv_path": [True, 3, 1.5], "print_summary": BAD_FLAGS, "stream": ["stdout", 3]}


@pytest.mark.parametrize("name, value", _sweep(MONITOR), ids=_ids(_sweep(MONITOR)))
def test_monitor(name, value):
    _refused(lambda: LossScaleMonitor(**{name: value}), name, value, shown=False)


# ---- load_state_dict -----------------------------------------------------------------------------------

GOOD_STATE = {"loss_scale": 1024.0, "good_steps": 1, "hysteresis_left": 1}
BAD_STATES = (
    [("state_dict", value) for value in (None, [1024.0], "x")]
    + [(key, "missing") for key in GOOD_STATE]
    + [(key, value) for key in GOOD_STATE for value in (None, "1", True, NAN, INF, -1, [1, 2])]
    + [
        ("good_steps", 1.5),
        ("hysteresis_left", 0),
        ("hysteresis_left", 2),
        ("good_steps", 100),
        ("loss_scale", 0.5),
        ("loss_scale", 1e39),
    ]
)


def _bad_state(key, value):
    if key == "state_dict":
        return value
    if value == "missing":
        return {k: v for k, v in GOOD_STATE.items() if k != key}
    return dict(GOOD_STATE, **{key: value})


def _state_owners():
    manager = DynamicLossScaleManager(2**10, scale_window=100)
    cell = DynamicLossScaleUpdateCell(2.0**10, 2, 100)
    step = _cell(scale_sense=DynamicLossScaleManager(2**10, scale_window=100).get_update_cell())
    return {"manager": manager, "update_cell": cell, "train_cell": step}


@pytest.mark.parametrize("key, value", BAD_STATES, ids=[f"{k}={v!r}" for k, v in BAD_STATES])
def test_dynamic_load_state_dict_names_the_key_and_changes_nothing(key, value):
    for owner, target in _state_owners().items():
        before = target.state_dict()
        with pytest.raises((TypeError, ValueError)) as refused:
            target.load_state_dict(_bad_state(key, value))
        message = str(refused.value)
        assert (key if key != "state_dict" else "state_dict") in message, (owner, message)
        assert target.state_dict() == before, owner


@pytest.mark.parametrize(
    "state",
    [None, {}, {"loss_scale": None}, {"loss_scale": NAN}, {"loss_scale": 512.0}, {"loss_scale": "1024"}],
    ids=repr,
)
def test_fixed_load_state_dict(state):
    for target in (FixedLossScaleManager(1024.0), FixedLossScaleUpdateCell(1024.0)):
        with pytest.raises((TypeError, ValueError)) as refused:
            target.load_state_dict(state)
        assert "state_dict" in str(refused.value)


@pytest.mark.parametrize("value", [1024, np.float32(1024.0), np.int64(1024), fractions.Fraction(1024)], ids=repr)
def test_any_real_number_is_taken_as_its_float(value):
    """The checks accept any real number (an int, a NumPy scalar, a Fraction) and pass on its Python float. Passing
    the value on as given broke later: a Fraction reached Tensor() (a TypeError in the update cell, both scalers and
    clipping), and a NumPy float32 made the policy and TorchGradScaler.state_dict() unserialisable by json."""
    half = value / 2048  # 0.5, of the same type
    policy = LossScalePolicy(init_scale=value, growth_factor=half * 4, min_scale=half, max_scale=value * 4)
    assert json.loads(json.dumps(dataclasses.asdict(policy))) == dataclasses.asdict(
        LossScalePolicy(init_scale=1024.0, growth_factor=2.0, min_scale=0.5, max_scale=4096.0)
    )
    manager = DynamicLossScaleManager(init_loss_scale=value, scale_factor=half * 4)
    assert manager.get_update_cell().get_loss_scale() == 1024.0
    assert float(FixedLossScaleUpdateCell(value).get_loss_scale()) == 1024.0
    torch_state = TorchGradScaler(init_scale=value, growth_factor=half * 4, backoff_factor=half).state_dict()
    assert json.loads(json.dumps(torch_state)) == {
        "scale": 1024.0,
        "growth_factor": 2.0,
        "backoff_factor": 0.5,
        "growth_interval": 2000,
        "_growth_tracker": 0,
    }
    assert float(GradScaler(init_loss_scaling=value, incr_ratio=half * 4).get_loss_scaling()) == 1024.0
    net = regression_net()
    step = TrainOneStepWithLossScaleCell(
        net, nn.SGD(net.trainable_params(), 0.1), Tensor(np.float32(8.0)), clip_global_norm=half
    )
    assert step.clip_global_norm == 0.5


def test_sweep_size():
    """The number of bad inputs this file tries (reported in the closing note of the issue)."""
    tables = [DYNAMIC_MANAGER, FIXED, POLICY, CELL, BUILD, CORE, GRAD_SCALER, TORCH_SCALER, KERAS, MONITOR]
    count = sum(len(_sweep(table)) for table in tables) + len(BAD_SCALES) + 4 + 6 + 7 + 2
    count += len(BAD_STATES) * 3 + 6 * 2
    assert count > 400
