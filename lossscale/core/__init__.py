"""The core: loss scaling itself, which every other layer delegates to.

The rule (:mod:`~lossscale.core.policy`, with other libraries' rules in :mod:`~lossscale.core.presets`),
the update cells that run it in a graph (:mod:`~lossscale.core.update_cells`), the backends' overflow
checks (:mod:`~lossscale.core.overflow`), clipping by global norm (:mod:`~lossscale.core.clipping`) and
:class:`~lossscale.core.scaler.LossScaler`, which holds a scale and scales, unscales, checks and updates it.
Imports MindSpore and nothing of lossscale's other layers.
"""
