"""lossscale: safe float16 loss scaling for MindSpore on CPU, GPU and Ascend.

Layers (see docs/design.md):

- :mod:`lossscale.policy`: the pure update rule (the specification);
- :mod:`lossscale.scaler`: ``LossScaler``, loss scaling itself, which everything below delegates to;
- :mod:`lossscale.update_cells`: graph-mode update cells;
- :mod:`lossscale.managers`: MindSpore-style managers that produce update cells;
- :mod:`lossscale.overflow`: overflow detection per backend;
- :mod:`lossscale.train_cell`: the one-graph training step (with :mod:`lossscale.accumulation`,
  :mod:`lossscale.clipping`, :mod:`lossscale.bookkeeping`, :mod:`lossscale.running_statistics` and
  :mod:`lossscale.checkpoints`);
- :mod:`lossscale.integration`: ``build_train_network`` and ``Model``;
- :mod:`lossscale.grad_scaler`, :mod:`lossscale.loss_scale_optimizer`: the Paddle/PyTorch and Keras
  front-ends (with :mod:`lossscale.optimizer_states`); :mod:`lossscale.presets`: other libraries' rules;
- :mod:`lossscale.monitor`: the ``LossScaleMonitor`` callback;
- :mod:`lossscale.diagnostics`, :mod:`lossscale.plots`, :mod:`lossscale.cli`: the command line.

The public names are imported on first use (``lossscale.GradScaler`` imports MindSpore then), so
``python -m lossscale --help`` answers without loading MindSpore.
"""
import importlib

__version__ = "0.2.0"

_EXPORTS = {
    "DynamicLossScaleManager": "lossscale.managers",
    "DynamicLossScaleUpdateCell": "lossscale.update_cells",
    "FixedLossScaleManager": "lossscale.managers",
    "FixedLossScaleUpdateCell": "lossscale.update_cells",
    "GradScaler": "lossscale.grad_scaler",
    "LossScaleMonitor": "lossscale.monitor",
    "LossScaleOptimizer": "lossscale.loss_scale_optimizer",
    "LossScalePolicy": "lossscale.policy",
    "LossScaleState": "lossscale.policy",
    "LossScaler": "lossscale.scaler",
    "Model": "lossscale.integration",
    "PRESET_NAMES": "lossscale.presets",
    "PersistentOverflowError": "lossscale.bookkeeping",
    "TorchGradScaler": "lossscale.grad_scaler",
    "TrainOneStepWithLossScaleCell": "lossscale.train_cell",
    "build_train_network": "lossscale.integration",
    "choose_overflow_check": "lossscale.overflow",
    "get_preset": "lossscale.presets",
    "restore_loss_scale": "lossscale.checkpoints",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'lossscale' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
