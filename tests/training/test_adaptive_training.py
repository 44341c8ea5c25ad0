"""The adaptive-window rule in MindSpore's training API: AdaptiveLossScaleManager, Model, build_train_network,
restore_loss_scale and the core, each equal to the pure rule (lossscale.core.adaptive)."""

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
import pytest
from mindspore import Tensor, nn

from lossscale import (
    AdaptiveLossScaleManager,
    AdaptiveLossScaleUpdateCell,
    LossScaleMonitor,
    LossScaler,
    Model,
    TrainOneStepWithLossScaleCell,
    build_train_network,
    restore_loss_scale,
)
from lossscale.core.adaptive import AdaptiveWindowRule, run_adaptive
from lossscale.core.rule import to_state_dict

SCHEDULE = [False] * 12 + [True] * 3 + [False] * 9 + [True, False, True, True] + [False] * 8


def test_the_managers_host_rule_is_the_rule():
    manager = AdaptiveLossScaleManager(init_loss_scale=2**10, scale_window=4, max_scale_window=40, min_scale_window=4)
    expected = run_adaptive(AdaptiveWindowRule(2**10, 2, 4, 40, 4), SCHEDULE)
    for overflow, state in zip(SCHEDULE, expected):
        manager.update_loss_scale(overflow)
        assert manager.get_state() == state
    assert manager.get_drop_overflow_update() and manager.increase_ratio == 2 and manager.decrease_ratio == 0.5


def _data(flags):
    """One batch per flag; an inf in the data makes its step overflow."""
    x = np.ones((len(flags) * 2, 4), np.float32)
    for i, flag in enumerate(flags):
        if flag:
            x[2 * i, 0] = np.inf
    return ds.NumpySlicesDataset({"x": x, "y": np.ones((len(flags) * 2, 1), np.float32)}, shuffle=False).batch(2)


def test_model_trains_with_the_manager_and_the_device_follows_the_rule():
    """lossscale.Model with the manager: skips where the data overflows, the scale and the window as the rule's,
    read back by the manager from the device."""
    ms.set_seed(0)
    net = nn.Dense(4, 1)
    manager = AdaptiveLossScaleManager(init_loss_scale=2**10, scale_window=4, max_scale_window=40, min_scale_window=4)
    monitor = LossScaleMonitor(print_summary=False)
    model = Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 1e-3), loss_scale_manager=manager)
    model.train(1, _data(SCHEDULE), callbacks=[monitor])
    assert isinstance(model.train_network.loss_scaling_manager, AdaptiveLossScaleUpdateCell)
    expected = run_adaptive(AdaptiveWindowRule(2**10, 2, 4, 40, 4), SCHEDULE)
    assert [record["overflow"] for record in monitor.records] == SCHEDULE
    assert [record["next_loss_scale"] for record in monitor.records] == [state.scale for state in expected]
    assert manager.state_dict() == to_state_dict(manager.rule, expected[-1])


def _train_cell(network=None):
    ms.set_seed(0)
    network = network or nn.WithLossCell(nn.Dense(4, 1), nn.MSELoss())
    manager = AdaptiveLossScaleManager(init_loss_scale=2**10, scale_window=4, max_scale_window=40, min_scale_window=4)
    return TrainOneStepWithLossScaleCell(
        network, nn.Momentum(network.trainable_params(), 0.01, 0.9), manager.get_update_cell()
    )


def _batch(flag):
    return Tensor(np.full((2, 4), np.inf if flag else 1.0, np.float32)), Tensor(np.ones((2, 1), np.float32))


def test_restore_loss_scale_resumes_the_window_state():
    """A checkpoint loaded the usual MindSpore way into the bare network, then restore_loss_scale: the resumed
    run continues as the uninterrupted one (window state included)."""
    whole = _train_cell()
    for flag in SCHEDULE:
        whole(*_batch(flag))
    first = _train_cell()
    for flag in SCHEDULE[:20]:
        first(*_batch(flag))
    checkpoint = {parameter.name: parameter.clone() for parameter in first.get_parameters()}
    network = nn.WithLossCell(nn.Dense(4, 1), nn.MSELoss())
    ms.load_param_into_net(network, checkpoint)
    resumed = _train_cell(network)
    loaded = restore_loss_scale(resumed, checkpoint)
    assert {"scale_window", "list_index", "current_iterator_step"} <= set(loaded)
    for flag in SCHEDULE[20:]:
        resumed(*_batch(flag))
    assert resumed.loss_scaling_manager.state_dict() == whole.loss_scaling_manager.state_dict()


def test_build_train_network_and_the_core_take_the_rule():
    net = nn.Dense(4, 1)
    manager = AdaptiveLossScaleManager(init_loss_scale=2**12, scale_window=20)
    train_net = build_train_network(net, nn.SGD(net.trainable_params(), 1e-3), nn.MSELoss(), loss_scale_manager=manager)
    assert isinstance(train_net.loss_scaling_manager, AdaptiveLossScaleUpdateCell)
    core = LossScaler(AdaptiveWindowRule(8.0, 2, 40), name="adaptive_rule_core")
    assert core.dynamic and core.rule == AdaptiveWindowRule(8.0, 2, 40) and core.state_dict()["scale_window"] == 40
    with pytest.raises(ValueError, match=r"\[min_loss_scale, max_loss_scale\] = \[1.0"):
        core.set_scale(0.5)


def test_load_state_dict_reaches_the_device_cell_in_use_and_nothing_changes_on_error():
    manager = AdaptiveLossScaleManager(init_loss_scale=2**10, scale_window=20)
    cell = manager.get_update_cell()
    step = TrainOneStepWithLossScaleCell(
        nn.WithLossCell(nn.Dense(4, 1), nn.MSELoss()), nn.SGD(nn.Dense(4, 1).trainable_params(), 0.1), cell
    )
    step(*_batch(False))
    state = dict(manager.state_dict(), loss_scale=64.0, scale_window=30, list_index=1)
    manager.load_state_dict(state)
    assert cell.state_dict() == state and step.get_loss_scale() == 64.0
    with pytest.raises(ValueError, match="scale_window"):
        manager.load_state_dict(dict(state, scale_window=31))
    assert manager.state_dict() == state
