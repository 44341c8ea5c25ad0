"""lossscale: safe float16 loss scaling for MindSpore on CPU, GPU and Ascend.

Layers (see docs/design.md):

- :mod:`lossscale.policy`: the pure update rule (the specification);
- :mod:`lossscale.scaler`: ``LossScaler``, loss scaling itself, which everything below delegates to;
- :mod:`lossscale.update_cells`: graph-mode update cells;
- :mod:`lossscale.managers`: MindSpore-style managers that produce update cells;
- :mod:`lossscale.overflow`: overflow detection per backend;
- :mod:`lossscale.train_cell`: the one-graph training step (with :mod:`lossscale.accumulation`,
  :mod:`lossscale.clipping` and :mod:`lossscale.bookkeeping`);
- :mod:`lossscale.integration`: ``build_train_network`` and ``Model``;
- :mod:`lossscale.grad_scaler`, :mod:`lossscale.loss_scale_optimizer`: the Paddle/PyTorch and Keras
  front-ends (with :mod:`lossscale.optimizer_states`); :mod:`lossscale.presets`: other libraries' rules;
- :mod:`lossscale.monitor`: the ``LossScaleMonitor`` callback;
- :mod:`lossscale.diagnostics`, :mod:`lossscale.plots`, :mod:`lossscale.cli`: the command line.
"""
from lossscale.grad_scaler import GradScaler, TorchGradScaler
from lossscale.integration import Model, build_train_network
from lossscale.loss_scale_optimizer import LossScaleOptimizer
from lossscale.managers import DynamicLossScaleManager, FixedLossScaleManager
from lossscale.monitor import LossScaleMonitor
from lossscale.overflow import choose_overflow_check
from lossscale.policy import LossScalePolicy, LossScaleState
from lossscale.presets import PRESET_NAMES, get_preset
from lossscale.scaler import LossScaler
from lossscale.train_cell import PersistentOverflowError, TrainOneStepWithLossScaleCell
from lossscale.update_cells import DynamicLossScaleUpdateCell, FixedLossScaleUpdateCell

__version__ = "0.1.0"

__all__ = [
    "DynamicLossScaleManager",
    "DynamicLossScaleUpdateCell",
    "FixedLossScaleManager",
    "FixedLossScaleUpdateCell",
    "GradScaler",
    "LossScaleOptimizer",
    "LossScaleMonitor",
    "LossScalePolicy",
    "LossScaleState",
    "LossScaler",
    "Model",
    "PersistentOverflowError",
    "TorchGradScaler",
    "TrainOneStepWithLossScaleCell",
    "PRESET_NAMES",
    "build_train_network",
    "choose_overflow_check",
    "get_preset",
]
