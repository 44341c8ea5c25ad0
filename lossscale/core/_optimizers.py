"""What kind of optimizer a front-end or train cell was given, told by what it holds (no import of the layer
that defines it)."""

from mindspore import Parameter, nn


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
