"""lossscale: safe float16 loss scaling for MindSpore on CPU, GPU and Ascend.

MindSpore's API is here, at the top level; the other frameworks' front-ends are one import each
(:mod:`lossscale.torch`, :mod:`lossscale.paddle`, :mod:`lossscale.keras`). The layers (docs/design.md), each a
sub-package that imports only itself and the layers below:

- :mod:`lossscale.core`: loss scaling itself (the rule, update cells, overflow checks, ``LossScaler``);
- :mod:`lossscale.training`: managers, the one-graph train cell and its parts, ``Model``, checkpoints, monitor;
- :mod:`lossscale.frontends`: PyTorch's and Paddle's ``GradScaler``, tf.keras' ``LossScaleOptimizer``;
- :mod:`lossscale.demo`: the command line (``python -m lossscale``), which the library never imports.

The public names are imported on first use (``lossscale.GradScaler`` imports MindSpore then), so
``python -m lossscale --help`` answers without loading MindSpore.
"""

import importlib

__version__ = "0.2.0"

_EXPORTS = {
    "AdaptiveLossScaleManager": "lossscale.training.managers",
    "AdaptiveLossScaleUpdateCell": "lossscale.core.adaptive",
    "AdaptiveWindowRule": "lossscale.core.adaptive",
    "AutomaticLossScaleRule": "lossscale.core.automatic",
    "DynamicLossScaleManager": "lossscale.training.managers",
    "DynamicLossScaleUpdateCell": "lossscale.core.policy",
    "FixedRule": "lossscale.core.rule",
    "FixedLossScaleManager": "lossscale.training.managers",
    "FixedLossScaleUpdateCell": "lossscale.core.update_cells",
    "GradScaler": "lossscale.frontends.grad_scaler",
    "LossScaleMonitor": "lossscale.training.monitor",
    "LossScaleOptimizer": "lossscale.frontends.keras",
    "LossScalePolicy": "lossscale.core.policy",
    "LossScaleRule": "lossscale.core.rule",
    "LossScaleUpdateCell": "lossscale.core.update_cells",
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
    "prefer_fast_cpu_convolutions": "lossscale.core.compat",
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
