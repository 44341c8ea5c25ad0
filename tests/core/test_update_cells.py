"""Graph update cells against the pure policy, and against MindSpore's own cell."""

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from mindspore import Parameter, Tensor, nn
from mindspore.common import dtype as mstype
from nets import tiered

from conftest import UpdateCellDriver
from lossscale import DynamicLossScaleUpdateCell, FixedLossScaleUpdateCell, TrainOneStepWithLossScaleCell
from lossscale.core._parameters import write_parameter
from lossscale.core.policy import LossScalePolicy, LossScaleState, initial_state, run, update

# Policies compiled once for the whole module (MindSpore compiles each new Cell).
FIXED_POLICIES = {
    "mindspore_like": dict(loss_scale_value=2.0**10, scale_factor=2, scale_window=3),
    "hysteresis": dict(loss_scale_value=2.0**20, scale_factor=2, scale_window=4, hysteresis=3),
    "consecutive": dict(
        loss_scale_value=2.0**8, scale_factor=4, scale_window=2, hysteresis=2, consecutive_hysteresis=True
    ),
    "bounded": dict(loss_scale_value=64.0, scale_factor=2, scale_window=1, min_loss_scale=8.0, max_loss_scale=512.0),
    "near_float32_max": dict(loss_scale_value=2.0**125, scale_factor=2, scale_window=1),
    # the first backoff lands exactly on the smallest normal float32 (2**-126), which stays; the next one is below it
    # and gives 0 (no subnormal scales), and 0 stays
    "no_floor": dict(
        loss_scale_value=2.0**-124, scale_factor=2, scale_window=5, min_loss_scale=0.0, backoff_factor=0.25
    ),
}
_SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def drivers():
    return {name: UpdateCellDriver(DynamicLossScaleUpdateCell(**kwargs)) for name, kwargs in FIXED_POLICIES.items()}


def _assert_cell_follows_policy(driver, flags):
    cell = driver.update_cell
    cell.set_state(initial_state(cell.policy))
    expected = run(cell.policy, flags)
    for step, (flag, state) in enumerate(zip(flags, expected)):
        returned = driver(Tensor(flag))
        assert bool(returned.asnumpy()) == flag
        assert cell.get_state() == state, f"step {step}: flags {flags[: step + 1]}"


# The README's tier: MindSpore's rule, hysteresis, and the scale falling to 0; the slow tier every policy.
@pytest.mark.parametrize("name", tiered(sorted(FIXED_POLICIES), {"mindspore_like", "hysteresis", "no_floor"}))
@_SETTINGS
@given(flags=st.lists(st.booleans(), min_size=1, max_size=60))
@example(flags=[True] * 12 + [False, True, False])  # "no_floor" reaches 2**-126, then 0, where a clean step keeps it
def test_graph_cell_equals_policy_on_random_overflows(drivers, name, flags):
    _assert_cell_follows_policy(drivers[name], flags)


_SWITCHABLE = {}  # consecutive_hysteresis -> a compiled driver whose rule is held in Parameters


def _switchable_driver(consecutive):
    """A compiled driver of a cell whose rule is held in Parameters, one per hysteresis mode (shared by the tests)."""
    driver = _SWITCHABLE.get(consecutive)
    if driver is None:
        cell = DynamicLossScaleUpdateCell(1.0, 2, 1, consecutive_hysteresis=consecutive, mutable_rule=True)
        driver = _SWITCHABLE.setdefault(consecutive, UpdateCellDriver(cell))
    return driver


@settings(max_examples=25, deadline=None)
@given(
    scale_exp=st.integers(-10, 127),
    factor=st.sampled_from([1.5, 2.0, 3.0, 4.0, 10.0]),
    window=st.integers(1, 6),
    hysteresis=st.integers(1, 4),
    consecutive=st.booleans(),
    min_exp=st.one_of(st.none(), st.integers(-12, 0)),
    flags=st.lists(st.booleans(), min_size=1, max_size=120),
)
def test_random_policy_graph_equals_policy(scale_exp, factor, window, hysteresis, consecutive, min_exp, flags):
    """Random rules, applied by one compiled cell per hysteresis mode whose rule is held in Parameters
    (GradScaler's mode): ``set_policy`` reaches the compiled graph, so every example reuses it."""
    min_scale = 1.0 if min_exp is None else 2.0**min_exp
    policy = DynamicLossScaleUpdateCell(
        max(2.0**scale_exp, min_scale),
        factor,
        window,
        hysteresis=hysteresis,
        consecutive_hysteresis=consecutive,
        min_loss_scale=min_scale,
    ).policy
    driver = _switchable_driver(consecutive)
    cell = driver.update_cell
    cell.set_policy(policy, initial_state(policy))
    expected = run(policy, flags)
    for flag, state in zip(flags, expected):
        driver(Tensor(flag))
        got = cell.get_state()
        assert got == state
        assert np.isfinite(got.scale) and min_scale <= got.scale <= float(np.finfo(np.float32).max)


def _mindspore_trajectory(kwargs, flags):
    reference = nn.DynamicLossScaleUpdateCell(**kwargs)
    return UpdateCellDriver(reference, bind=False).run(flags)


@pytest.mark.parametrize(
    "kwargs, flags",
    [
        (
            dict(loss_scale_value=2**24, scale_factor=2, scale_window=2000),
            [bool(x) for x in np.random.RandomState(1).rand(4500) < 0.0004],
        ),
        (
            dict(loss_scale_value=2**12, scale_factor=2, scale_window=5),
            [bool(x) for x in np.random.RandomState(2).rand(400) < 0.15],
        ),
        (dict(loss_scale_value=8, scale_factor=2, scale_window=1), [True] * 5 + [False] * 5 + [True, False] * 10),
    ],
)
@pytest.mark.slow
def test_equals_mindspore_cell_on_ordinary_sequences(kwargs, flags):
    ours = UpdateCellDriver(DynamicLossScaleUpdateCell(**kwargs)).run(flags)
    assert ours == _mindspore_trajectory(kwargs, flags)
    assert len(set(ours)) > 2  # the sequence exercised growth and backoff


def test_mindspore_cell_grows_to_inf_and_ours_does_not():
    kwargs = dict(loss_scale_value=2.0**127, scale_factor=2, scale_window=1)
    assert np.isinf(_mindspore_trajectory(kwargs, [False])[-1])
    assert UpdateCellDriver(DynamicLossScaleUpdateCell(**kwargs)).run([False, False]) == [2.0**127, 2.0**127]


def test_scale_parameter_of_shape_one():
    cell = DynamicLossScaleUpdateCell(16.0, 2, 1)

    class Driver(nn.Cell):
        def __init__(self):
            super().__init__()
            self.cell = cell
            self.scale = Parameter(Tensor([16.0], mstype.float32), name="scale")
            cell.bind_scale_parameter(self.scale)

        def construct(self, overflow):
            return self.cell(self.scale, overflow)

    driver = Driver()
    driver(Tensor(False))
    driver(Tensor(True))
    driver(Tensor(True))
    assert driver.scale.shape == (1,) and driver.scale.asnumpy().tolist() == [8.0]
    assert cell.get_loss_scale() == 8.0


def test_get_loss_scale_reads_the_device_once_bound():
    cell = DynamicLossScaleUpdateCell(2.0**10, 2, 1)
    assert cell.get_loss_scale() == 1024.0  # before binding: the initial value, like MindSpore
    driver = UpdateCellDriver(cell)
    driver.run([False, False])
    assert cell.get_loss_scale() == 4096.0


def test_state_dict_round_trip_and_validation():
    source = UpdateCellDriver(DynamicLossScaleUpdateCell(2.0**10, 2, 5, hysteresis=3))
    source.run([False, False, True])
    saved = source.update_cell.state_dict()
    assert saved == {"loss_scale": 1024.0, "good_steps": 0, "hysteresis_left": 2}
    target = UpdateCellDriver(DynamicLossScaleUpdateCell(2.0**10, 2, 5, hysteresis=3))
    target.update_cell.load_state_dict(saved)
    flags = [True, False, False, True, True, False]
    assert target.run(flags) == source.run(flags)
    before = target.update_cell.state_dict()
    with pytest.raises(ValueError, match=r"'state_dict\['good_steps'\]' must be an int in \[0, 4\]"):
        target.update_cell.load_state_dict(dict(before, good_steps=5))
    assert target.update_cell.state_dict() == before


def test_counters_do_not_grow_without_bound():
    driver = UpdateCellDriver(DynamicLossScaleUpdateCell(1.0, 2, 3, max_loss_scale=2.0))
    driver.run([False] * 50)
    assert driver.update_cell.get_state() == LossScaleState(scale=2.0, good_steps=50 % 3, hysteresis_left=1)


def test_fixed_cell_passes_the_flag_and_keeps_the_scale():
    driver = UpdateCellDriver(FixedLossScaleUpdateCell(128.0))
    for flag in (True, False, True):
        assert bool(driver(Tensor(flag)).asnumpy()) == flag
    assert float(driver.scale.asnumpy()) == 128.0
    assert driver.update_cell.state_dict() == {"loss_scale": 128.0}
    with pytest.raises(ValueError, match="loss_scale"):
        driver.update_cell.load_state_dict({"loss_scale": 64.0})


@pytest.mark.parametrize(
    "kwargs, error, argument",
    [
        (dict(loss_scale_value=2.0**10, scale_factor=0.5, scale_window=10), ValueError, "'scale_factor'.*0.5"),
        (dict(loss_scale_value=2.0**10, scale_factor=2, scale_window=0), ValueError, "'scale_window'.*0"),
        (dict(loss_scale_value=2.0**10, scale_factor=2, scale_window=3.0), TypeError, "'scale_window'.*3.0"),
        (dict(loss_scale_value=float("inf"), scale_factor=2, scale_window=1), ValueError, "'loss_scale_value'.*inf"),
        (dict(loss_scale_value=0.5, scale_factor=2, scale_window=1), ValueError, "'loss_scale_value'.*0.5"),
        (dict(loss_scale_value=8, scale_factor=2, scale_window=1, max_loss_scale=4), ValueError, "'loss_scale_value'"),
        (dict(loss_scale_value=8, scale_factor=2, scale_window=1, min_loss_scale=-2), ValueError, "'min_loss_scale'"),
    ],
)
def test_dynamic_cell_rejects_bad_arguments(kwargs, error, argument):
    with pytest.raises(error, match=argument):
        DynamicLossScaleUpdateCell(**kwargs)


def test_fixed_cell_rejects_non_positive_scale():
    with pytest.raises(ValueError, match="loss_scale_value"):
        FixedLossScaleUpdateCell(0.0)


def test_window_open_follows_the_adopting_train_cells_accumulation_window():
    """window_open() (what the manager uses to count bad_step per optimizer step) is True exactly after a call
    that ended inside an accumulation window; a later adopter without accumulation unbinds the window."""
    cell = DynamicLossScaleUpdateCell(loss_scale_value=8.0, scale_factor=2, scale_window=100)
    assert cell.window_open() is False  # not adopted
    net = nn.WithLossCell(nn.Dense(2, 1), nn.MSELoss())
    train = TrainOneStepWithLossScaleCell(net, nn.SGD(net.trainable_params(), 0.1), cell, accumulation_steps=2)
    x, y = Tensor(np.ones((2, 2), np.float32)), Tensor(np.zeros((2, 1), np.float32))
    opened = []
    for _ in range(3):
        train(x, y)
        opened.append(cell.window_open())
    assert opened == [True, False, True]
    TrainOneStepWithLossScaleCell(net, nn.SGD(net.trainable_params(), 0.1), cell)
    assert cell.window_open() is False  # the old cell's window is open, but the cell now follows the new adopter
    with pytest.raises(RuntimeError, match="adopted by another train cell"):
        train(x, y)  # and the old cell, which no longer owns it, is refused


def _parameter_names(cell):
    return sorted(parameter.name for parameter in cell.get_parameters())


def test_a_mutable_rule_is_chosen_when_the_cell_is_built_and_its_parameters_take_the_prefix():
    """The rule's numbers are Parameters from the start (two cells of one graph each with its own prefix), and
    whether they are is fixed: assigning mutable_rule is refused, a compiled graph keeps its Parameters."""
    constant, mutable = (
        DynamicLossScaleUpdateCell(8.0, 2, 10),
        DynamicLossScaleUpdateCell(8.0, 2, 10, mutable_rule=True),
    )
    mutable.rename_parameters("p")
    assert _parameter_names(constant) == ["loss_scale_good_steps", "loss_scale_hysteresis_left"]
    assert _parameter_names(mutable) == sorted(
        f"p.{name}"
        for name in (
            "good_steps",
            "hysteresis_left",
            "growth_factor",
            "backoff_factor",
            "min_scale",
            "max_scale",
            "window",
            "full_hysteresis",
            "dynamic",
        )
    )
    assert (constant.mutable_rule, mutable.mutable_rule, mutable.dynamic) == (False, True, True)
    with pytest.raises(AttributeError, match="fixed when the cell is built"):
        constant.mutable_rule = True
    with pytest.raises(TypeError, match="'mutable_rule' must be a bool"):
        DynamicLossScaleUpdateCell(8.0, 2, 10, mutable_rule=1)


# label: (policy in FIXED_POLICIES, state written straight into the Parameters, flag, that state brought within
# the rule); each field clipped differently, so each of its bounds shows.
OUT_OF_RULE_STATES = {
    "scale_above_max": ("bounded", (4096.0, 0, 1), True, (512.0, 0, 1)),
    "scale_below_min": ("bounded", (2.0, 0, 1), False, (8.0, 0, 1)),
    "scale_nan": ("bounded", (float("nan"), 0, 1), True, (512.0, 0, 1)),  # restarts from the ceiling
    "good_steps_negative": ("hysteresis", (64.0, -5, 3), False, (64.0, 0, 3)),
    "hysteresis_left_zero": ("hysteresis", (64.0, 0, 0), False, (64.0, 0, 1)),
    "hysteresis_left_above_full": ("hysteresis", (64.0, 0, 9), True, (64.0, 0, 3)),
}


@pytest.mark.parametrize("label", sorted(OUT_OF_RULE_STATES))
def test_a_state_outside_the_rule_is_brought_within_it_at_the_next_step(drivers, label):
    """A state no rule reaches, written straight into the Parameters (as ``load_param_into_net`` does with a
    checkpoint of another configuration, or of MindSpore's cell at an inf scale), is clipped into the rule
    (a non-finite scale restarts from the ceiling), then the step applies the rule to it."""
    name, (scale, good_steps, hysteresis_left), flag, within = OUT_OF_RULE_STATES[label]
    driver = drivers[name]
    cell = driver.update_cell
    write_parameter(driver.scale, np.float32(scale))
    write_parameter(cell.good_steps, good_steps)
    write_parameter(cell.hysteresis_left, hysteresis_left)
    driver(Tensor(flag))
    assert cell.get_state() == update(cell.policy, LossScaleState(*within), flag)


def test_set_policy_reaches_a_compiled_graph_with_its_bounds_and_keeps_the_state_within_them():
    """Every number of the new rule reaches the graph compiled before (here the floor and the ceiling); without a
    state, the current one is kept, its counters clipped to the new window and hysteresis; the MindSpore
    attributes follow the new rule."""
    driver = _switchable_driver(False)
    cell = driver.update_cell
    # Every number given: the driver is shared, so its current rule is whatever the test before it set.
    wide = LossScalePolicy(init_scale=64.0, growth_factor=2.0, backoff_factor=0.5, growth_interval=5, hysteresis=3)
    cell.set_policy(wide, LossScaleState(scale=64.0, good_steps=4, hysteresis_left=3))
    narrow = replace(wide, growth_factor=4.0, growth_interval=2, hysteresis=2, min_scale=16.0, max_scale=128.0)
    cell.set_policy(narrow)
    assert cell.get_state() == LossScaleState(scale=64.0, good_steps=1, hysteresis_left=2)
    assert (cell.scale_factor, cell.scale_window) == (4.0, 2)
    flags = [False, False, True, True, True, True, True, True]
    expected = [state.scale for state in run(narrow, flags, cell.get_state())]
    assert driver.run(flags) == expected
    assert max(expected) == 128.0 and expected[-1] == 16.0  # the ceiling, then the floor


def test_a_cell_switched_to_a_fixed_scale_changes_nothing_where_the_rule_would():
    """set_dynamic(False) reaches the compiled graph: a growth and a backoff both due, neither the scale nor a
    counter moves."""
    driver = _switchable_driver(False)
    cell = driver.update_cell
    policy = LossScalePolicy(init_scale=64.0, growth_factor=2.0, backoff_factor=0.5, growth_interval=2, hysteresis=1)
    cell.set_policy(policy, LossScaleState(scale=64.0, good_steps=1, hysteresis_left=1))
    cell.set_dynamic(False)
    try:
        assert not cell.dynamic
        assert driver.run([False, True]) == [64.0, 64.0]
        assert cell.get_state() == LossScaleState(scale=64.0, good_steps=1, hysteresis_left=1)
    finally:
        cell.set_dynamic(True)  # the driver is shared


def test_set_policy_and_set_dynamic_need_the_rule_in_parameters_and_the_same_hysteresis_mode():
    cell = DynamicLossScaleUpdateCell(2.0**10, 2, 5, hysteresis=3)
    for call in (lambda: cell.set_policy(cell.policy), lambda: cell.set_dynamic(False)):
        with pytest.raises(RuntimeError, match=r"needs an update cell built with mutable_rule=True"):
            call()
    cell = DynamicLossScaleUpdateCell(2.0**10, 2, 5, hysteresis=3, mutable_rule=True)
    before = (cell.policy, cell.get_state())
    for mode in ({"consecutive_hysteresis": True}, {"refill_hysteresis_on_backoff": True}):
        with pytest.raises(ValueError, match="'policy' must keep the hysteresis mode of this update cell"):
            cell.set_policy(replace(cell.policy, **mode))
        assert (cell.policy, cell.get_state()) == before


# 1000.1 is not a float32: a train cell's scale Parameter holds it as 1000.0999755859375.
INEXACT = 1000.1
INEXACT_FLOAT32 = float(np.float32(INEXACT))


@pytest.mark.parametrize(
    "make",
    [lambda: FixedLossScaleUpdateCell(INEXACT), lambda: DynamicLossScaleUpdateCell(INEXACT, 2, 10)],
    ids=["fixed", "dynamic"],
)
def test_a_scale_float32_cannot_hold_reads_the_same_before_and_after_a_train_cell_adopts_the_cell(make):
    cell = make()
    assert INEXACT_FLOAT32 != INEXACT and cell.get_loss_scale() == INEXACT_FLOAT32
    UpdateCellDriver(cell)
    assert cell.get_loss_scale() == INEXACT_FLOAT32


def test_a_loaded_scale_float32_cannot_hold_reads_as_float32_holds_it():
    cell = DynamicLossScaleUpdateCell(2.0**10, 2, 10)
    cell.load_state_dict({"loss_scale": INEXACT, "good_steps": 3, "hysteresis_left": 1})
    assert cell.state_dict() == {"loss_scale": INEXACT_FLOAT32, "good_steps": 3, "hysteresis_left": 1}


def test_a_fixed_cell_loads_its_own_state_dict_of_a_scale_float32_cannot_hold():
    """The saved scale is compared in float32, as the cell holds it."""
    cell = FixedLossScaleUpdateCell(INEXACT)
    saved = cell.state_dict()
    assert saved == {"loss_scale": INEXACT_FLOAT32}
    cell.load_state_dict(saved)
    FixedLossScaleUpdateCell(INEXACT_FLOAT32).load_state_dict({"loss_scale": INEXACT})
    next_float32 = float(np.nextafter(np.float32(INEXACT), np.float32(np.inf)))
    with pytest.raises(ValueError, match="must equal the fixed loss scale 1000.1"):
        cell.load_state_dict({"loss_scale": next_float32})


def test_the_rule_cannot_be_assigned_only_set():
    """`cell.policy = p` was accepted: the host then reported the new rule while a compiled step kept the old one.
    Assigning it is refused, naming set_policy(); set_policy() changes both (with mutable_rule=True)."""
    cell = DynamicLossScaleUpdateCell(1024.0, 2.0, 1000)
    with pytest.raises(
        AttributeError,
        match=r"DynamicLossScaleUpdateCell.policy cannot be assigned: .* "
        r"set_policy\(policy\)",
    ):
        cell.policy = LossScalePolicy(init_scale=8.0)
    assert cell.policy.growth_interval == 1000
    cell = DynamicLossScaleUpdateCell(1024.0, 2.0, 1000, mutable_rule=True)
    cell.set_policy(LossScalePolicy(init_scale=1024.0, growth_interval=5))
    assert cell.policy.growth_interval == 5 and cell.scale_window == 5


@pytest.mark.parametrize(
    "make",
    [lambda: FixedLossScaleUpdateCell(1024.0), lambda: DynamicLossScaleUpdateCell(1024.0, 2.0, 1000)],
    ids=["fixed", "dynamic"],
)
def test_the_initial_scale_cannot_be_assigned(make):
    """MindSpore's get_loss_scale() returns loss_scale_value, so there `cell.loss_scale_value = 2048.0` makes a train
    cell built afterwards start at 2048. Ours was accepted and read back while the train cell started at 1024."""
    cell = make()
    with pytest.raises(
        AttributeError,
        match=f"{type(cell).__name__}.loss_scale_value cannot be assigned: it is the initial scale as given",
    ):
        cell.loss_scale_value = 2048.0
    net = nn.Dense(2, 1)
    step = TrainOneStepWithLossScaleCell(net, nn.SGD(net.trainable_params(), 0.1), cell)
    assert cell.loss_scale_value == cell.get_loss_scale() == step.get_loss_scale() == 1024.0
