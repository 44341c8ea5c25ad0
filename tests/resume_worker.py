"""Worker for the fresh-process resume test (run as a script, not collected by pytest).

    python resume_worker.py MODE OUT_DIR

MODE ``full`` trains steps [0, STEPS); ``first`` trains [0, SPLIT) and saves a checkpoint;
``resume`` loads that checkpoint into a freshly built train cell and trains [SPLIT, STEPS).
Each mode writes ``<MODE>.json`` (per-step overflow flags and scales, counters) and
``<MODE>.npz`` (every Parameter at the end).
"""

import json
import os
import sys

import mindspore as ms
import numpy as np
from mindspore import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]  # this checkout's tests/ and lossscale/, whatever is installed
from nets import regression_batches, regression_net, snapshot, train_calls  # noqa: E402

from lossscale import DynamicLossScaleManager, TrainOneStepWithLossScaleCell  # noqa: E402

STEPS, SPLIT = 16, 9
INJECT = {2, 3, 8, 11}  # overflow at these steps (hysteresis 2 absorbs some)


def build():
    ms.set_seed(0)
    net = regression_net()
    manager = DynamicLossScaleManager(init_loss_scale=2**12, scale_window=3, hysteresis=2)
    return TrainOneStepWithLossScaleCell(
        net, nn.Adam(net.trainable_params(), 0.01), manager.get_update_cell(), clip_global_norm=5.0
    )


def train(step, first, last):
    _, flags, scales = train_calls(step, regression_batches(STEPS)[first:last], INJECT, start=first)
    return flags, scales


def main(mode, out):
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    step = build()
    checkpoint = os.path.join(out, "first.ckpt")
    if mode == "full":
        flags, scales = train(step, 0, STEPS)
    elif mode == "first":
        flags, scales = train(step, 0, SPLIT)
        ms.save_checkpoint(step, checkpoint)
    else:
        not_loaded, _ = ms.load_param_into_net(step, ms.load_checkpoint(checkpoint))
        if not_loaded:
            raise SystemExit(f"parameters not restored: {not_loaded}")
        flags, scales = train(step, SPLIT, STEPS)
    with open(os.path.join(out, f"{mode}.json"), "w", encoding="utf-8") as handle:
        json.dump({"flags": flags, "scales": scales, "counters": step.overflow_counters()}, handle)
    np.savez(os.path.join(out, f"{mode}.npz"), **snapshot(step))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
