"""What the train cell and the front-ends check of an optimizer: its kind, told by what it holds (no import of the
layer that defines it), its own ``loss_scale``, and bfloat16 Parameters on CPU."""

import numpy as np
from mindspore import Parameter, get_context, nn
from mindspore.common import dtype as mstype
from mindspore.ops import constexpr


def is_parameter_optimizer(optimizer):
    """Whether ``optimizer`` is a Cell holding its Parameters in ``parameters``, as MindSpore's train cells need
    (``mindspore.experimental.optim`` and ``mint.optim`` optimizers, which are not ``nn.Optimizer``s).

    Example:
        >>> sgd = nn.SGD(nn.Dense(2, 1).trainable_params(), 0.1)
        >>> is_parameter_optimizer(sgd), is_parameter_optimizer(nn.Dense(2, 1))
        (True, False)
    """
    parameters = getattr(optimizer, "parameters", None)
    return (
        isinstance(optimizer, nn.Cell)
        and isinstance(parameters, (tuple, list))
        and all(isinstance(parameter, Parameter) for parameter in parameters)
    )


def is_loss_scale_optimizer(optimizer):
    """Whether ``optimizer`` is a tf.keras-style ``LossScaleOptimizer`` (it unscales gradients and wraps an inner
    optimizer), which scales in the user's own step: the train cell and ``Model`` refuse it saying so.

    Example:
        >>> is_loss_scale_optimizer(nn.SGD(nn.Dense(2, 1).trainable_params(), 0.1))
        False
    """
    return callable(getattr(optimizer, "get_unscaled_gradients", None)) and hasattr(optimizer, "inner_optimizer")


@constexpr
def refuse_bfloat16_on_cpu(dtypes, argument="optimizer"):
    """TypeError if the Parameters an optimizer updates (their ``dtypes``) include bfloat16 and the device target is
    CPU: MindSpore has no bfloat16 ``Assign`` kernel there, so such a step fails inside MindSpore, after the loss
    scaling has run. A constant check: eagerly, or while a compiled function is traced.

    Example:
        >>> refuse_bfloat16_on_cpu((mstype.float32, mstype.float16))
        True
    """
    if mstype.bfloat16 in dtypes and get_context("device_target") == "CPU":
        raise TypeError(
            f"'{argument}' updates bfloat16 Parameters ({dtypes.count(mstype.bfloat16)} of "
            f"{len(dtypes)}), which cannot be trained on device_target 'CPU': MindSpore has no bfloat16 "
            f"Assign kernel there. Keep the Parameters in float32 (amp levels O2/O3 compute in float16 "
            f"with float32 weights) or float16, or train on Ascend."
        )
    return True


def check_optimizer_loss_scale(optimizer, fixed_scale=None):
    """Return True if ``optimizer`` divides by the loss scale itself and that is allowed; refuse otherwise.

    An optimizer built with ``loss_scale=S`` divides its gradients by S. That is right only
    for a fixed scale equal to S with nothing else unscaling (MindSpore's
    ``FixedLossScaleManager(S, drop_overflow_update=False)`` recipe, ``fixed_scale=S``);
    anywhere else the gradients would be divided twice or by the wrong factor.

    Example:
        >>> from mindspore import nn
        >>> check_optimizer_loss_scale(nn.SGD(nn.Dense(2, 1).trainable_params(), 0.1))
        False
    """
    optimizer_scale = float(getattr(optimizer, "loss_scale", 1.0))
    if optimizer_scale == 1.0:
        return False
    # Compared as the device holds both: the same Python float given to the manager and the optimizer is accepted.
    if fixed_scale is not None and np.float32(optimizer_scale) == np.float32(fixed_scale):
        return True
    expected = "dynamic" if fixed_scale is None else repr(float(np.float32(fixed_scale)))
    raise ValueError(
        f"'optimizer.loss_scale' is {optimizer_scale!r} but the loss scale is {expected}: the gradients would be "
        f"unscaled twice or by the wrong factor. Build the optimizer without 'loss_scale' (lossscale unscales), "
        f"or, with a fixed scale that is applied every step, give it exactly that scale."
    )
