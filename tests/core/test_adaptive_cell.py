"""AdaptiveLossScaleUpdateCell: the graph cell equals the pure rule (lossscale.core.adaptive) step for step, drives
the train cell, and resumes exactly from a checkpoint or a state dict."""

import dataclasses
from dataclasses import astuple

import mindspore as ms
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mindspore import Tensor, nn
from train_cell_harness import same_weights, save_cell_checkpoint

from conftest import UpdateCellDriver
from lossscale import AdaptiveLossScaleUpdateCell, LossScaler, TrainOneStepWithLossScaleCell
from lossscale.core.adaptive import AdaptiveWindowRule, run_adaptive
from lossscale.core.rule import to_state_dict

BOUNDS = {"default": (1000, 20), "small": (30, 4)}


def _cell_states(driver, flags):
    """Feed each flag; the cell's state after every step."""
    states = []
    for flag in flags:
        driver(Tensor(bool(flag)))
        states.append(astuple(driver.update_cell.get_state()))
    return states


@pytest.fixture(scope="module")
def drivers():
    """One compiled driver per bound set, reused by the random schedules (a fresh cell state is loaded each time)."""
    return {
        name: UpdateCellDriver(AdaptiveLossScaleUpdateCell(2.0**10, 2, bounds[1], *bounds))
        for name, bounds in BOUNDS.items()
    }


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(flags=st.lists(st.booleans(), min_size=1, max_size=120), name=st.sampled_from(sorted(BOUNDS)))
def test_graph_cell_equals_the_rule_on_random_schedules(drivers, flags, name):
    driver = drivers[name]
    rule = AdaptiveWindowRule(2.0**10, 2, BOUNDS[name][1], *BOUNDS[name])
    driver.update_cell.load_state_dict(to_state_dict(rule, rule.initial_state()))
    expected = [astuple(state) for state in run_adaptive(rule, flags)]
    assert _cell_states(driver, flags) == expected


def test_a_schedule_through_every_move_step_by_step():
    """Growth up two levels, three back-offs to the hidden level (window 1), and back up to min_scale_window."""
    flags = [False] * (20 * 3 + 30 * 3) + [True] * 3 + [False] * 6
    rule = AdaptiveWindowRule(2.0**10, 2, 20)
    driver = UpdateCellDriver(AdaptiveLossScaleUpdateCell(2.0**10, 2, 20))
    states = _cell_states(driver, flags)
    assert states == [astuple(state) for state in run_adaptive(rule, flags)]
    windows = [state[1] for state in states]
    assert {20, 30, 40, 1} <= set(windows) and windows[-1] == 20 and states[-1][2] == 0


def test_the_scale_never_grows_to_inf():
    driver = UpdateCellDriver(AdaptiveLossScaleUpdateCell(2.0**127, 2, 20))
    assert driver.run([False] * 20) == [2.0**127] * 20


def _train_cell(update_cell):
    ms.set_seed(0)
    net = nn.WithLossCell(nn.Dense(4, 1), nn.MSELoss())
    return TrainOneStepWithLossScaleCell(net, nn.Momentum(net.trainable_params(), 0.01, 0.9), update_cell)


BATCHES = [
    (Tensor(np.full((2, 4), value, np.float32)), Tensor(np.ones((2, 1), np.float32)))
    for value in [1.0] * 5 + [np.inf] * 3 + [1.0] * 6
]


def test_it_drives_the_train_cell_and_a_checkpoint_resumes_step_for_step(tmp_path):
    """Trained 8 steps, saved with mindspore.save_checkpoint, loaded into a new train cell: the next 6 steps
    (scales, skips, weights, window state) are those of the uninterrupted run."""
    whole = _train_cell(AdaptiveLossScaleUpdateCell(2.0**10, 2, 4, 40, 4))
    outputs = [whole(*batch) for batch in BATCHES]
    assert [bool(o[1]) for o in outputs] == [False] * 5 + [True] * 3 + [False] * 6
    first = _train_cell(AdaptiveLossScaleUpdateCell(2.0**10, 2, 4, 40, 4))
    for batch in BATCHES[:8]:
        first(*batch)
    checkpoint = save_cell_checkpoint(first, tmp_path / "run.ckpt")
    resumed = _train_cell(AdaptiveLossScaleUpdateCell(2.0**10, 2, 4, 40, 4))
    not_loaded, _ = ms.load_param_into_net(resumed, checkpoint)
    assert not_loaded == []
    tail = [resumed(*batch) for batch in BATCHES[8:]]
    assert [float(o[2]) for o in tail] == [float(o[2]) for o in outputs[8:]]
    assert resumed.loss_scaling_manager.state_dict() == whole.loss_scaling_manager.state_dict()
    same_weights(resumed, whole)


def test_state_dict_round_trip_and_nothing_changes_on_a_bad_state():
    source = UpdateCellDriver(AdaptiveLossScaleUpdateCell(2.0**10, 2, 20))
    source.run([False] * 25 + [True] * 2)
    state = source.update_cell.state_dict()
    target = UpdateCellDriver(AdaptiveLossScaleUpdateCell(2.0**10, 2, 20))
    target.update_cell.load_state_dict(state)
    assert target.update_cell.state_dict() == state
    assert target.run([False] * 30) == source.run([False] * 30)
    before = target.update_cell.state_dict()
    for key, value, error in [
        ("scale_window", 35, ValueError),
        ("list_index", 9, ValueError),
        ("window_up_count", 4, ValueError),
        ("last_overflow_iter", 10**6, ValueError),
        ("loss_scale", 0.5, ValueError),
        ("cur_iter", 2.0, TypeError),
    ]:
        with pytest.raises(error, match=key):
            target.update_cell.load_state_dict(dict(before, **{key: value}))
        assert target.update_cell.state_dict() == before


def test_a_named_core_prefixes_the_window_parameters():
    core = LossScaler(AdaptiveLossScaleUpdateCell(8.0, 2, 20), name="adaptive_core")
    names = sorted(p.name for p in core.get_parameters())
    assert names == sorted(
        f"adaptive_core.{name}"
        for name in (
            "scale",
            "scale_window",
            "list_index",
            "scale_window_up_count",
            "scale_window_down_count",
            "current_iterator_step",
            "last_overflow_iterator_step",
        )
    )
    assert core.dynamic and core.state_dict()["scale_window"] == 20


def test_a_core_sets_an_adaptive_state_and_refuses_another_rule():
    """A mutable core takes a new state and initial scale; another factor or other window levels are constants of
    its update graph, so such a rule is refused, naming what is fixed."""
    rule = AdaptiveWindowRule(8.0, 2, 20)
    core = LossScaler(rule, name="adaptive_set_rule", mutable_rule=True)
    state = run_adaptive(rule, [False] * 45 + [True])[-1]
    core.set_rule(dataclasses.replace(rule, init_scale=64.0), state)
    assert core.update_cell.get_state() == state and core.get_scale() == state.scale
    for changed in (dict(scale_factor=4), dict(max_scale_window=500)):
        with pytest.raises(ValueError, match="'rule' must have this update cell's structure"):
            core.set_rule(dataclasses.replace(rule, **changed))
        assert core.update_cell.get_state() == state
    assert core.update_cell.read("good_steps") == state.good_steps == 0
    with pytest.raises(RuntimeError, match="needs a LossScaler built with mutable_rule=True"):
        LossScaler(rule, name="adaptive_set_rule_constant").set_rule(state=state)


@pytest.mark.parametrize(
    "arguments, error, message",
    [
        ({"loss_scale_value": 0.5}, ValueError, "'loss_scale_value'"),
        ({"scale_factor": 1}, ValueError, "'scale_factor'"),
        ({"max_scale_window": 20}, ValueError, "'max_scale_window' must be larger than 'min_scale_window'"),
        ({"min_scale_window": 2.5}, TypeError, "'min_scale_window' must be an int"),
    ],
)
def test_bad_arguments_are_refused_naming_them(arguments, error, message):
    kwargs = dict({"loss_scale_value": 1024.0, "scale_factor": 2, "scale_window": 20}, **arguments)
    with pytest.raises(error, match=message):
        AdaptiveLossScaleUpdateCell(**kwargs)
