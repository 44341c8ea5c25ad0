"""What a Keras ``LossScaleOptimizer`` reads from and forwards to the optimizer it wraps, as functions of the two.

tf.keras' wrapper forwards every attribute it does not have to its inner optimizer. A MindSpore
optimizer's hyperparameters are graph constants or Parameters, so reads are forwarded (``beta1``,
``parameters``, ``iterations``) and only the learning rate (alias ``lr``) can be set through the
wrapper; setting another of the inner optimizer's attributes is refused, because it would hide the
inner value without changing what the optimizer trains with. Keras-only methods (``get_config``,
``get_weights``, ...) raise ``AttributeError`` saying what to do instead.

Example::

    opt = LossScaleOptimizer(nn.Adam(params, 1e-3))
    opt.beta1          # the inner optimizer's
    opt.lr = 1e-4      # sets the inner optimizer's learning rate
"""

import functools
import numbers

import numpy as np
from mindspore import Tensor, nn

from lossscale.core._parameters import write_parameter

_KERAS_SERIALIZATION = (
    " A MindSpore optimizer holds its Parameters, so it is not rebuilt from a config: keep the "
    "object, and save and restore its state with mindspore.save_checkpoint(opt, path) and "
    "mindspore.load_param_into_net(opt, mindspore.load_checkpoint(path))."
)
_KERAS_WEIGHTS = (
    " A MindSpore optimizer's state is its Parameters: opt.get_parameters() (the scale: opt.loss_scale), "
    "saved with mindspore.save_checkpoint and restored with mindspore.load_param_into_net."
)
# Keras optimizer methods without a MindSpore counterpart: what to do instead.
_KERAS_ONLY = {
    "get_config": _KERAS_SERIALIZATION,
    "from_config": _KERAS_SERIALIZATION,
    "get_weights": _KERAS_WEIGHTS,
    "set_weights": _KERAS_WEIGHTS,
    "variables": _KERAS_WEIGHTS,
}


@functools.lru_cache(maxsize=None)
def _cell_attributes():
    """What nn.Cell itself defines or sets on every instance (training, phase, ...): MindSpore sets these on any
    Cell."""
    return frozenset(dir(nn.Cell)) | frozenset(vars(nn.Cell()))


def _learning_rate_value(value):
    """A learning rate given to the wrapper: a finite number >= 0 (or a one-value float Tensor)."""
    if isinstance(value, Tensor):
        array = value.asnumpy()
        if array.dtype == np.bool_ or array.size != 1:
            raise ValueError(f"'learning_rate' must be one float value, but got {array.dtype} of shape {array.shape}.")
        value = array.reshape(-1)[0].item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not np.isfinite(value) or value < 0:
        raise ValueError(f"'learning_rate' must be a finite number >= 0, but got {value!r}.")
    return float(value)


def set_learning_rate(inner, value):
    """Write ``value`` into ``inner``'s learning-rate Parameter (a schedule or per-group rates are refused)."""
    if getattr(inner, "dynamic_lr", False) or getattr(inner, "is_group_lr", False):
        raise ValueError(
            "the inner optimizer has a learning-rate schedule or per-group rates; set them when building it."
        )
    write_parameter(inner.learning_rate, _learning_rate_value(value))


def refuse_shadowing(wrapper, inner, name):
    """``AttributeError`` if setting ``name`` on ``wrapper`` would hide ``inner``'s attribute: a public attribute
    ``inner`` has and the wrapper's class does not (tf.keras forwards hyperparameters such as ``beta_1``; a MindSpore
    optimizer's are graph constants or Parameters, so only the learning rate is forwarded). nn.Cell's own
    attributes, which MindSpore sets, are never refused."""
    if inner is None or name.startswith("_") or name in vars(wrapper) or name in _cell_attributes():
        return
    if hasattr(inner, name) and not hasattr(type(wrapper), name):
        raise AttributeError(
            f"cannot set {name!r} on a {type(wrapper).__name__}: it would hide the inner optimizer's {name} (which "
            f"reads would then return) without changing what it trains with. Only learning_rate is forwarded; "
            f"give {name} to the inner optimizer when building it ({type(inner).__name__}(..., {name}=...))."
        )


def forwarded(wrapper, inner, name):
    """``inner``'s attribute ``name`` (what the wrapper lacks); ``AttributeError`` saying what to do instead for
    Keras-only methods."""
    try:
        return getattr(inner, name)
    except AttributeError:
        raise AttributeError(
            f"'{type(wrapper).__name__}' object has no attribute {name!r}, and its inner optimizer "
            f"({type(inner).__name__}) has none either.{_KERAS_ONLY.get(name, '')}"
        ) from None
