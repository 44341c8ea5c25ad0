"""Shared pieces of the train-cell tests: batches, a dynamic-scale cell over the regression network, running
it with injected overflows, comparing weights and writing checkpoints."""

import mindspore as ms
import numpy as np
from mindspore import nn
from nets import regression_batches, regression_net, train_calls, training_state

from lossscale import DynamicLossScaleManager, TrainOneStepWithLossScaleCell

BATCHES = regression_batches(8, seed=11)


def dynamic_cell(net=None, **kwargs):
    """A train cell over ``net`` (the regression network by default) with Momentum and a dynamic scale of 2**12
    that grows after 2 clean steps; ``kwargs`` go to DynamicLossScaleManager."""
    net = net or regression_net()
    manager = DynamicLossScaleManager(init_loss_scale=2**12, scale_window=2, **kwargs)
    return TrainOneStepWithLossScaleCell(net, nn.Momentum(net.trainable_params(), 0.02, 0.9), manager.get_update_cell())


def run_cell(cell, batches, inject=()):
    """Call ``cell`` on ``batches`` (an inf in the input of the calls in ``inject``); return flags and scales."""
    return train_calls(cell, batches, inject)[1:]


def same_weights(a, b):
    """Assert that two cells' training states are bit-identical."""
    for name, value in training_state(a).items():
        np.testing.assert_array_equal(training_state(b)[name], value, err_msg=name)


def save_cell_checkpoint(cell, path):
    """Save ``cell`` to ``path`` and return the checkpoint's dict, as loaded back."""
    ms.save_checkpoint(cell, str(path))
    return ms.load_checkpoint(str(path))
