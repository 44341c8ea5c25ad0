"""tf.keras' ``tf.keras.mixed_precision.LossScaleOptimizer`` for MindSpore optimizers, in one import.

Example:
    >>> from mindspore import nn
    >>> from lossscale.keras import LossScaleOptimizer
    >>> opt = LossScaleOptimizer(nn.SGD(nn.Dense(2, 1).trainable_params(), 0.1))
    >>> opt.dynamic, opt.initial_scale, opt.dynamic_growth_steps
    (True, 32768.0, 2000)
"""

from lossscale.frontends.keras import LossScaleOptimizer

__all__ = ["LossScaleOptimizer"]
