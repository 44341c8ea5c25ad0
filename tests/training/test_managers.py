"""Managers: MindSpore's API and defaults, validation, host policy, device mirroring, state_dict."""

import mindspore as ms
import numpy as np
import pytest
from mindspore.amp import LossScaleManager

from conftest import UpdateCellDriver
from lossscale import (
    DynamicLossScaleManager,
    DynamicLossScaleUpdateCell,
    FixedLossScaleManager,
    FixedLossScaleUpdateCell,
)
from lossscale.core.policy import run


def test_defaults_match_mindspore():
    ours, theirs = DynamicLossScaleManager(), ms.amp.DynamicLossScaleManager()
    assert ours.get_loss_scale() == theirs.get_loss_scale() == 2**24
    assert (ours.scale_factor, ours.scale_window) == (theirs.scale_factor, theirs.scale_window) == (2, 2000)
    fixed, fixed_ms = FixedLossScaleManager(), ms.amp.FixedLossScaleManager()
    assert fixed.get_loss_scale() == fixed_ms.get_loss_scale() == 128.0
    assert fixed.get_drop_overflow_update() is fixed_ms.get_drop_overflow_update() is True
    assert isinstance(ours, LossScaleManager) and isinstance(fixed, LossScaleManager)


def test_positional_arguments_follow_mindspore():
    manager = DynamicLossScaleManager(2**10, 4, 30)
    assert (manager.get_loss_scale(), manager.scale_factor, manager.scale_window) == (1024.0, 4, 30)
    assert FixedLossScaleManager(1024.0, False).get_drop_overflow_update() is False


@pytest.mark.parametrize(
    "kwargs, increase, decrease",
    [
        ({}, 2, 0.5),
        ({"scale_factor": 4}, 4, 0.25),
        ({"scale_factor": 4, "backoff_factor": 0.75}, 4, 0.75),  # ours only: MindSpore's is always 1 / scale_factor
    ],
)
def test_mindspores_ratio_names_report_the_rule(kwargs, increase, decrease):
    manager = DynamicLossScaleManager(**kwargs)
    assert (manager.increase_ratio, manager.decrease_ratio) == (increase, decrease)
    assert (manager.policy.growth_factor, manager.policy.backoff_factor) == (increase, decrease)
    if "backoff_factor" not in kwargs:
        theirs = ms.amp.DynamicLossScaleManager(**kwargs)
        assert (theirs.increase_ratio, theirs.decrease_ratio) == (increase, decrease)


@pytest.mark.parametrize(
    "factory, error, pattern",
    [
        (lambda: DynamicLossScaleManager(scale_factor=0.5), ValueError, r"'scale_factor'.*\(1.0, .*0.5"),
        (lambda: DynamicLossScaleManager(scale_window=0), ValueError, r"'scale_window'.*\[1, .*0"),
        (lambda: DynamicLossScaleManager(scale_window=1.5), TypeError, r"'scale_window'.*1.5"),
        (lambda: DynamicLossScaleManager(init_loss_scale=0.5), ValueError, r"'init_loss_scale'.*0.5"),
        (lambda: DynamicLossScaleManager(init_loss_scale=float("inf")), ValueError, r"'init_loss_scale'.*inf"),
        (lambda: DynamicLossScaleManager(hysteresis=0), ValueError, r"'hysteresis'.*0"),
        (lambda: DynamicLossScaleManager(backoff_factor=2.0), ValueError, r"'backoff_factor'.*2.0"),
        (lambda: DynamicLossScaleManager(max_loss_scale=8.0), ValueError, r"'init_loss_scale'"),
        (lambda: FixedLossScaleManager(loss_scale=0.5), ValueError, r"'loss_scale'.*0.5"),
        (lambda: FixedLossScaleManager(loss_scale=float("nan")), ValueError, r"'loss_scale'.*nan"),
        (lambda: FixedLossScaleManager(loss_scale="128"), TypeError, r"'loss_scale'"),
        (lambda: FixedLossScaleManager(drop_overflow_update="no"), TypeError, r"'drop_overflow_update'"),
    ],
)
def test_bad_arguments(factory, error, pattern):
    with pytest.raises(error, match=pattern):
        factory()


def test_min_loss_scale_allows_a_scale_below_one():
    assert DynamicLossScaleManager(init_loss_scale=0.5, min_loss_scale=0.125).get_loss_scale() == 0.5


def test_host_update_follows_the_policy():
    manager = DynamicLossScaleManager(2**10, 2, 3, hysteresis=2)
    flags = [False, True, True, True, False, False, False, False]
    expected = [s.scale for s in run(manager.policy, flags)]
    got = []
    for flag in flags:
        manager.update_loss_scale(flag)
        got.append(manager.get_loss_scale())
    assert got == expected


MINDSPORE_BOOKKEEPING = (
    "cur_iter",
    "last_overflow_iter",
    "bad_step",
    "bad_step_max",
    "increase_ratio",
    "decrease_ratio",
    "scale_factor",
    "scale_window",
)


def _bookkeeping(manager):
    return {name: getattr(manager, name) for name in MINDSPORE_BOOKKEEPING}


def test_host_update_matches_mindspore_manager_with_defaults():
    """Scale and MindSpore's public counters, step by step, over a random sequence with overflow runs."""
    ours, theirs = DynamicLossScaleManager(2**10, 2, 4), ms.amp.DynamicLossScaleManager(2**10, 2, 4)
    assert _bookkeeping(ours) == _bookkeeping(theirs)
    flags = [bool(x) for x in np.random.RandomState(3).rand(300) < 0.2] + [True] * 12 + [False] * 9
    for flag in flags:
        ours.update_loss_scale(np.array([flag]))  # what Model passes: the overflow output read on the host
        theirs.update_loss_scale(np.array([flag]))
        assert ours.get_loss_scale() == theirs.get_loss_scale()
        assert _bookkeeping(ours) == _bookkeeping(theirs)


@pytest.mark.parametrize("on_device", [False, True], ids=["host", "device_cell"])
def test_too_many_overflows_in_a_row_stop_like_mindspores_manager(on_device):
    """MindSpore's manager raises RuntimeError once more than bad_step_max (1000) updates in a row overflowed;
    Model calls update_loss_scale after every step, so a run that overflows for good stops there. A clean step
    resets the count."""
    ours, theirs = DynamicLossScaleManager(2**10, 2, 4), ms.amp.DynamicLossScaleManager(2**10, 2, 4)
    assert ours.bad_step_max == theirs.bad_step_max == 1000
    ours.bad_step_max = theirs.bad_step_max = 3
    driver = UpdateCellDriver(ours.get_update_cell()) if on_device else None
    for flag in [True, True, True, False, True, True, True]:
        if driver is not None:
            driver.run([flag])
        ours.update_loss_scale(flag)
        theirs.update_loss_scale(flag)
    if driver is not None:
        driver.run([True])
    with pytest.raises(RuntimeError, match="Dynamic loss scale Continuous overflow 4 times") as raised:
        ours.update_loss_scale(True)
    with pytest.raises(RuntimeError, match="Dynamic loss scale Continuous overflow ") as theirs_raised:
        theirs.update_loss_scale(True)
    assert theirs_raised.value.args[1] == 4 and "bad_step_max=3" in str(raised.value)
    assert _bookkeeping(ours) == _bookkeeping(theirs)


@pytest.mark.parametrize("attribute", ["loss_scale", "scale_factor", "scale_window"])
def test_assigning_the_rule_is_refused_instead_of_diverging(attribute):
    """MindSpore lets these be assigned (its next update cell uses them, a running one keeps its own); ours held
    scale_factor and scale_window as plain attributes that the rule never read: the attribute changed, the rule
    did not. Now an AttributeError says to build a new manager (or cell); nothing changes."""
    manager = DynamicLossScaleManager(2**10, 2, 5)
    cell = manager.get_update_cell()
    for owner in (manager, cell) if attribute != "loss_scale" else (manager,):
        with pytest.raises(AttributeError, match=f"{attribute} cannot be assigned.*Build a new"):
            setattr(owner, attribute, 4)
    assert (manager.get_loss_scale(), manager.scale_factor, manager.scale_window) == (1024.0, 2, 5)
    assert (cell.scale_factor, cell.scale_window, cell.policy.growth_interval) == (2, 5, 5)


def test_update_cells_are_ours_with_the_manager_policy():
    manager = DynamicLossScaleManager(2**12, 4, 100, hysteresis=2, min_loss_scale=2.0, max_loss_scale=2.0**20)
    cell = manager.get_update_cell()
    assert isinstance(cell, DynamicLossScaleUpdateCell) and cell.policy == manager.policy
    assert isinstance(FixedLossScaleManager(64.0).get_update_cell(), FixedLossScaleUpdateCell)
    assert FixedLossScaleManager(64.0, drop_overflow_update=False).get_update_cell() is None


def test_manager_mirrors_the_device_once_its_cell_is_in_use():
    manager = DynamicLossScaleManager(2**10, 2, 2)
    manager.update_loss_scale(True)  # host-only step before training: 512
    cell = manager.get_update_cell()
    assert cell.policy == manager.policy and cell.get_loss_scale() == 512.0  # starts from the host state
    driver = UpdateCellDriver(cell)
    assert manager.get_loss_scale() == 512.0
    driver.run([False, False, False])
    assert manager.get_loss_scale() == 1024.0
    manager.update_loss_scale(True)  # what mindspore.train.Model calls: refresh only, no second step
    assert manager.get_loss_scale() == 1024.0
    assert manager.state_dict() == {"loss_scale": 1024.0, "good_steps": 1, "hysteresis_left": 1}


def test_a_cell_no_train_cell_uses_leaves_the_rule_to_the_host():
    """Until a train cell adopts one of its update cells, the manager runs the rule itself: a cell made only
    to look at neither answers for the scale nor stops the host's steps."""
    manager = DynamicLossScaleManager(2**10, 2, 2)
    unused = manager.get_update_cell()
    manager.update_loss_scale(True)
    assert manager.get_loss_scale() == 512.0 and unused.get_loss_scale() == 1024.0
    assert manager.get_update_cell().get_loss_scale() == 512.0


def test_a_cell_made_for_a_look_does_not_take_over_from_the_one_in_use():
    """The manager followed the last cell it made: a get_update_cell() after training started (to inspect it)
    left get_loss_scale() and state_dict() at that moment's values, and update_loss_scale() then ran the rule on
    the host beside the device's. It follows the most recent adopted cell; a cell adopted later takes over."""
    manager = DynamicLossScaleManager(2**10, 2, 2)
    driver = UpdateCellDriver(manager.get_update_cell())
    driver.run([False, False])
    looked_at = manager.get_update_cell()
    assert looked_at.get_loss_scale() == 2048.0
    driver.run([False, False, True])
    manager.update_loss_scale(True)  # Model's call after the overflowing step: a refresh, no host step
    assert manager.get_loss_scale() == float(driver.scale.asnumpy()) == 2048.0
    manager.load_state_dict({"loss_scale": 512.0, "good_steps": 1, "hysteresis_left": 1})
    assert float(driver.scale.asnumpy()) == 512.0  # into the cell in use
    adopter = UpdateCellDriver(looked_at)
    adopter.run([True])
    assert manager.get_loss_scale() == 1024.0  # the later adopter (from 2048) now leads


def test_state_dict_round_trip_into_a_fresh_manager_and_its_cell():
    source = DynamicLossScaleManager(2**10, 2, 3, hysteresis=2)
    for flag in (False, True, False):
        source.update_loss_scale(flag)
    target = DynamicLossScaleManager(2**10, 2, 3, hysteresis=2)
    target.load_state_dict(source.state_dict())
    assert target.state_dict() == source.state_dict() == {"loss_scale": 1024.0, "good_steps": 1, "hysteresis_left": 1}
    driver = UpdateCellDriver(target.get_update_cell())
    driver.run([False, False])
    assert target.get_loss_scale() == 2048.0


def test_state_dict_round_trip_at_a_floor_that_float32_rounds_down():
    source = DynamicLossScaleManager(1.0, 2, 5, min_loss_scale=0.7)
    for _ in range(3):
        source.update_loss_scale(True)
    assert source.get_loss_scale() == float(np.float32(0.7))
    target = DynamicLossScaleManager(1.0, 2, 5, min_loss_scale=0.7)
    target.load_state_dict(source.state_dict())
    assert target.state_dict() == source.state_dict()


def test_load_state_dict_rejects_bad_state_and_keeps_the_old_one():
    manager = DynamicLossScaleManager(2**10, 2, 3)
    before = manager.state_dict()
    with pytest.raises(ValueError, match=r"'state_dict\['good_steps'\]' must be an int in \[0, 2\], but got 3"):
        manager.load_state_dict(dict(before, good_steps=3))
    with pytest.raises(ValueError, match=r"'state_dict\['loss_scale'\]' must be a finite number"):
        manager.load_state_dict(dict(before, loss_scale=float("inf")))
    assert manager.state_dict() == before


@pytest.mark.parametrize("given, held", [(2.0**24 + 1, 2.0**24), (1.3, float(np.float32(1.3))), (1024.0, 1024.0)])
def test_fixed_manager_reports_the_scale_the_device_holds(given, held):
    manager = FixedLossScaleManager(given)
    assert manager.get_loss_scale() == manager.get_update_cell().get_loss_scale() == held
    assert manager.state_dict() == {"loss_scale": held}


def test_fixed_manager_state_dict():
    manager = FixedLossScaleManager(256.0)
    manager.update_loss_scale(True)
    assert manager.state_dict() == {"loss_scale": 256.0}
    with pytest.raises(ValueError, match="loss_scale"):
        manager.load_state_dict({"loss_scale": 128.0})
