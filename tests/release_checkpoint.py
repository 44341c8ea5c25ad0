"""Train-cell configurations whose checkpoints, written by lossscale 0.1.0 and 0.2.0, must keep loading.

``python tests/release_checkpoint.py OUT_DIR`` was run once with the 0.1.0 release (commit ed60d3f) and once
with 0.2.0 (commit b245416; ``adaptive_window`` too) to write, per configuration, ``<name>.ckpt`` (the train
cell saved after ``SPLIT`` calls) and ``<name>.npz`` (what the release then did on calls ``SPLIT..STEPS-1``:
losses, overflow flags, scales, the counters, and every Parameter at the end).
``tests/training/test_compatibility.py`` loads each checkpoint into a train cell built by the current code and
checks it continues exactly as the release did.
"""

import os
import sys

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn
from mindspore.common import dtype as mstype

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]
from nets import regression_batches, regression_net, snapshot, train_calls  # noqa: E402

from lossscale import DynamicLossScaleManager, TrainOneStepWithLossScaleCell  # noqa: E402

try:  # 0.2.0 on; the 0.1.0 data has no configuration of it
    from lossscale import AdaptiveLossScaleUpdateCell  # noqa: E402
except ImportError:
    AdaptiveLossScaleUpdateCell = None

STEPS, SPLIT = 14, 7


def _dynamic_hysteresis_clip():
    net = regression_net()
    manager = DynamicLossScaleManager(init_loss_scale=2**12, scale_window=3, hysteresis=2)
    return TrainOneStepWithLossScaleCell(
        net, nn.Adam(net.trainable_params(), 0.01), manager.get_update_cell(), clip_global_norm=5.0
    )


def _accumulation_debug():
    net = regression_net(seed=1)
    manager = DynamicLossScaleManager(init_loss_scale=2**10, scale_window=2)
    return TrainOneStepWithLossScaleCell(
        net,
        nn.Momentum(net.trainable_params(), 0.05, 0.9),
        manager.get_update_cell(),
        accumulation_steps=2,
        debug_overflow=True,
    )


def _fixed_tensor_scale():
    net = regression_net(seed=2)
    return TrainOneStepWithLossScaleCell(net, nn.SGD(net.trainable_params(), 0.05), Tensor(1024.0, mstype.float32))


def _adaptive_window():
    net = regression_net(seed=3)
    cell = AdaptiveLossScaleUpdateCell(2**10, 2, 2, max_scale_window=8, min_scale_window=2)
    return TrainOneStepWithLossScaleCell(net, nn.Adam(net.trainable_params(), 0.01), cell)


# name -> (builder, calls whose first input gets an inf)
CONFIGS = {
    "dynamic_hysteresis_clip": (_dynamic_hysteresis_clip, {2, 3, 8, 11}),
    "accumulation_debug": (_accumulation_debug, {1, 8, 9}),  # SPLIT=7 falls inside a window
    "fixed_tensor_scale": (_fixed_tensor_scale, {4, 10}),
    "adaptive_window": (_adaptive_window, {1, 2, 3, 9}),  # 0.2.0 on
}


def run_calls(step, injected, first, last):
    """Call ``step`` on batches [first, last); return losses, flags and scales."""
    return train_calls(step, regression_batches(STEPS, seed=7)[first:last], injected, start=first)


def write(out):
    """Write ``<name>.ckpt`` and ``<name>.npz`` for every configuration (run with the 0.1.0 release)."""
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    for name, (build, injected) in CONFIGS.items():
        if name == "adaptive_window" and AdaptiveLossScaleUpdateCell is None:
            continue
        ms.set_seed(0)
        step = build()
        run_calls(step, injected, 0, SPLIT)
        ms.save_checkpoint(step, os.path.join(out, f"{name}.ckpt"))
        losses, flags, scales = run_calls(step, injected, SPLIT, STEPS)
        counters = step.overflow_counters()
        params = {f"param:{k}": v for k, v in snapshot(step).items()}
        np.savez(
            os.path.join(out, f"{name}.npz"),
            losses=np.array(losses),
            flags=np.array(flags),
            scales=np.array(scales),
            counters=np.array([counters[k] for k in sorted(counters)]),
            **params,
        )


if __name__ == "__main__":
    write(sys.argv[1])
