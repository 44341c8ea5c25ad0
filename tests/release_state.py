"""Front-end states whose state dicts and checkpoints, written by lossscale 0.2.0, must keep loading.

``python tests/release_state.py OUT_DIR`` was run once with the 0.2.0 release (commit b245416, the last landed
revision of ``__version__ = "0.2.0"``) to write, per configuration, ``<name>.json``: the front-end's
``state_dict()`` and the weight after ``SPLIT`` iterations, and what 0.2.0 then did on iterations
``SPLIT..STEPS-1`` (skip flags, scales and the weight at the end); the ``LossScaleOptimizer``'s Parameters are also
saved as ``<name>.ckpt``. ``tests/training/test_compatibility.py`` loads each into a front-end built by the current
code and checks that it continues as 0.2.0 did.
"""

import json
import os
import sys

import mindspore as ms
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]
from nets import GradScalerRun, LossScaleOptimizerRun, reference_batches  # noqa: E402

from lossscale import GradScaler  # noqa: E402

STEPS, SPLIT = 12, 6
BATCHES = reference_batches(STEPS, injected={1, 2, 4, 7, 8})


def _torch():
    return GradScalerRun(GradScaler("cpu", init_scale=2.0**10, growth_interval=2), clip=1.0)


def _paddle():
    scaler = GradScaler(init_loss_scaling=2.0**10, incr_every_n_steps=2, decr_every_n_nan_or_inf=2)
    return GradScalerRun(scaler)


def _mindformers():
    scaler = GradScaler.from_preset(
        "mindformers", init_scale=2.0**10, scale_window=2, min_scale_window=2, max_scale_window=8
    )
    return GradScalerRun(scaler)


def _keras():
    return LossScaleOptimizerRun(0.05, initial_scale=2.0**10, dynamic_growth_steps=2)


# name -> builder of a run (tests/nets.py: ``iteration(x, y)``, ``weight()``, and its scaler or optimizer)
CONFIGS = {"torch_clip": _torch, "paddle_hysteresis": _paddle, "mindformers_window": _mindformers, "keras": _keras}


def front_end(run):
    """What saves and loads the run's state: its GradScaler, or its LossScaleOptimizer."""
    return getattr(run, "scaler", None) or run.optimizer


def scale_of(run):
    scaler = getattr(run, "scaler", None)
    return scaler.get_scale() if scaler is not None else float(run.optimizer.loss_scale.asnumpy())


def continue_run(run):
    """Iterations ``SPLIT..STEPS-1``: ``(skip flags, scales after each, weight at the end)``."""
    flags, scales = [], []
    for x, y in BATCHES[SPLIT:]:
        flags.append(run.iteration(x, y))
        scales.append(scale_of(run))
    return flags, scales, run.weight().tolist()


def to_json(value):
    """A state dict's value as JSON: an array as ``{"array": values, "dtype": name}``."""
    if isinstance(value, ms.Tensor):
        value = value.asnumpy()
    if isinstance(value, np.ndarray):
        return {"array": value.tolist(), "dtype": str(value.dtype)}
    return value.item() if isinstance(value, np.generic) else value


def from_json(value):
    return np.array(value["array"], value["dtype"]) if isinstance(value, dict) else value


def write(out):
    """Write ``<name>.json`` (and ``<name>.ckpt`` for the LossScaleOptimizer) for every configuration."""
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    for name, build in CONFIGS.items():
        run = build()
        for x, y in BATCHES[:SPLIT]:
            run.iteration(x, y)
        saved = {key: to_json(value) for key, value in front_end(run).state_dict().items()}
        if not hasattr(run, "scaler"):
            ms.save_checkpoint(run.optimizer, os.path.join(out, f"{name}.ckpt"))
        weight = run.weight().tolist()
        flags, scales, final = continue_run(run)
        record = dict(state_dict=saved, weight=weight, flags=flags, scales=scales, final_weight=final)
        with open(os.path.join(out, f"{name}.json"), "w") as handle:
            json.dump(record, handle, indent=1)


if __name__ == "__main__":
    write(sys.argv[1])
