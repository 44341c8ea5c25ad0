"""The other frameworks' front-ends for functional MindSpore loops: PyTorch's and Paddle's ``GradScaler`` and
tf.keras' ``LossScaleOptimizer``, with the per-optimizer state machine they share.

Imports :mod:`lossscale.core`; never the training layer or the demo. The ports :mod:`lossscale.torch`,
:mod:`lossscale.paddle` and :mod:`lossscale.keras` are one import each.
"""
