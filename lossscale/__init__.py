"""lossscale: safe float16 loss scaling for MindSpore on CPU, GPU and Ascend.

Layers (see docs/design.md):

- :mod:`lossscale.core.policy`: the pure update rule (the specification);
- :mod:`lossscale.core.scaler`: ``LossScaler``, loss scaling itself, which everything below delegates to;
- :mod:`lossscale.core.update_cells`: graph-mode update cells;
- :mod:`lossscale.training.managers`: MindSpore-style managers that produce update cells;
- :mod:`lossscale.core.overflow`: overflow detection per backend;
- :mod:`lossscale.training.train_cell`: the one-graph training step (with :mod:`lossscale.training.accumulation`,
  :mod:`lossscale.core.clipping`, :mod:`lossscale.training.bookkeeping`, :mod:`lossscale.training.running_statistics` and
  :mod:`lossscale.training.checkpoints`);
- :mod:`lossscale.training.integration`: ``build_train_network`` and ``Model``;
- :mod:`lossscale.frontends.grad_scaler`, :mod:`lossscale.frontends.keras`: the Paddle/PyTorch and Keras
  front-ends (with :mod:`lossscale.frontends.optimizer_states`); :mod:`lossscale.core.presets`: other libraries' rules;
- :mod:`lossscale.training.monitor`: the ``LossScaleMonitor`` callback;
- :mod:`lossscale.demo.diagnostics`, :mod:`lossscale.demo.plots`, :mod:`lossscale.demo.cli`: the command line.

The public names are imported on first use (``lossscale.GradScaler`` imports MindSpore then), so
``python -m lossscale --help`` answers without loading MindSpore.
"""
import importlib

__version__ = "0.2.0"

_EXPORTS = {
    "DynamicLossScaleManager": "lossscale.training.managers",
    "DynamicLossScaleUpdateCell": "lossscale.core.update_cells",
    "FixedLossScaleManager": "lossscale.training.managers",
    "FixedLossScaleUpdateCell": "lossscale.core.update_cells",
    "GradScaler": "lossscale.frontends.grad_scaler",
    "LossScaleMonitor": "lossscale.training.monitor",
    "LossScaleOptimizer": "lossscale.frontends.keras",
    "LossScalePolicy": "lossscale.core.policy",
    "LossScaleState": "lossscale.core.policy",
    "LossScaler": "lossscale.core.scaler",
    "Model": "lossscale.training.integration",
    "PRESET_NAMES": "lossscale.core.presets",
    "PersistentOverflowError": "lossscale.training.bookkeeping",
    "TorchGradScaler": "lossscale.frontends.grad_scaler",
    "TrainOneStepWithLossScaleCell": "lossscale.training.train_cell",
    "build_train_network": "lossscale.training.integration",
    "choose_overflow_check": "lossscale.core.overflow",
    "get_preset": "lossscale.core.presets",
    "restore_loss_scale": "lossscale.training.checkpoints",
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
