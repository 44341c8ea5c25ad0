"""``LossScaleOptimizer``: Keras' loss-scaling optimizer wrapper for MindSpore.

Seed: ``tf.keras.mixed_precision.LossScaleOptimizer``. The default rule is the
Keras 3 one (:func:`lossscale.presets.get_preset` ``("keras")``): the scale doubles
after ``dynamic_growth_steps`` consecutive finite steps and halves on a non-finite
one, with no floor. Unlike Keras, it never grows to inf.

Example (the seed's, with MindSpore)::

    opt = LossScaleOptimizer(nn.SGD(net.trainable_params(), 0.25))
    def forward(x):
        return opt.get_scaled_loss(loss_fn(net(x)))
    grad_fn = mindspore.value_and_grad(forward, None, opt.parameters)
    scaled_loss, grads = grad_fn(x)
    grads = opt.get_unscaled_gradients(grads)
    opt(grads)            # skipped if a gradient is inf/nan; the loss scale is updated here
"""
import numpy as np
from mindspore import Parameter, Tensor, nn, ops
from mindspore.common import dtype as mstype

from lossscale.overflow import any_nonfinite, unscale_gradients
from lossscale.policy import build_policy
from lossscale.presets import get_preset
from lossscale.update_cells import DynamicLossScaleUpdateCell

_KERAS_NAMES = {"init_scale": "initial_scale", "growth_interval": "dynamic_growth_steps"}


def _keras_policy(dynamic, initial_scale, dynamic_growth_steps, policy):
    """Validate Keras' arguments (``ValueError`` for anything invalid) and build the policy."""
    if not isinstance(dynamic, bool):
        raise ValueError(f"'dynamic' must be a bool, but got {dynamic!r}.")
    if policy is not None:
        if initial_scale is not None or dynamic_growth_steps is not None:
            raise ValueError("give either 'policy' or 'initial_scale'/'dynamic_growth_steps', not both.")
        return policy
    if not dynamic:
        if initial_scale is None:
            raise ValueError("'initial_scale' must be given when dynamic=False: it is the fixed loss scale.")
        if dynamic_growth_steps is not None:
            raise ValueError("'dynamic_growth_steps' cannot be given when dynamic=False.")
    fields = dict(init_scale=2.0**15 if initial_scale is None else initial_scale,
                  growth_interval=2000 if dynamic_growth_steps is None else dynamic_growth_steps)
    try:
        base = get_preset("keras")
        return build_policy(_KERAS_NAMES, **dict(vars(base), **fields))
    except TypeError as error:
        raise ValueError(str(error)) from None


class LossScaleOptimizer(nn.Cell):
    """Wrap a MindSpore optimizer with (dynamic) loss scaling, Keras style.

    Args:
        inner_optimizer (nn.Optimizer): the optimizer to wrap.
        dynamic (bool): dynamic loss scaling (default True) or a fixed scale.
        initial_scale (float): the initial scale; default 2**15 when dynamic; required
            when ``dynamic=False`` (it is then the fixed scale).
        dynamic_growth_steps (int): consecutive finite steps per doubling; default 2000.
        policy (LossScalePolicy, keyword only): another rule (see :mod:`lossscale.presets`).

    Raises:
        ValueError: for any invalid argument (as Keras).

    Calling the optimizer with *unscaled* gradients (from :meth:`get_unscaled_gradients`)
    applies them unless one is inf/nan, then updates the scale; it returns True when the
    step was skipped. Hyperparameters (``learning_rate``, ``beta1``, ``parameters`` ...)
    are read from the inner optimizer, and ``learning_rate`` can be set through the
    wrapper.

    Example:
        >>> from mindspore import nn
        >>> opt = LossScaleOptimizer(nn.SGD(nn.Dense(2, 1).trainable_params(), 0.25))
        >>> opt.dynamic, opt.initial_scale, opt.dynamic_growth_steps, float(opt.loss_scale)
        (True, 32768.0, 2000, 32768.0)
    """

    def __init__(self, inner_optimizer, dynamic=True, initial_scale=None, dynamic_growth_steps=None, *,
                 policy=None):
        super().__init__(auto_prefix=False)
        if not isinstance(inner_optimizer, nn.Optimizer):
            raise ValueError(f"'inner_optimizer' must be a mindspore.nn.Optimizer, but got "
                             f"{type(inner_optimizer).__name__}.")
        self._policy = _keras_policy(dynamic, initial_scale, dynamic_growth_steps, policy)
        self._dynamic = dynamic
        self._inner = inner_optimizer
        self._scale = Parameter(Tensor(np.float32(self._policy.init_scale)), name="loss_scale_optimizer_scale",
                                requires_grad=False)
        self._updater = DynamicLossScaleUpdateCell.from_policy(self._policy)
        self._updater.bind_scale_parameter(self._scale)
        self._hyper_map = ops.HyperMap()
        self._one = Tensor(1.0, mstype.float32)

    # ---- Keras API -----------------------------------------------------------------------------
    def get_scaled_loss(self, loss):
        """``loss * loss_scale``."""
        return loss * self._scale

    def get_unscaled_gradients(self, grads):
        """Every gradient divided by the loss scale (computed in float32)."""
        return unscale_gradients(self._hyper_map, self._one / self._scale, grads)

    def construct(self, grads):
        skipped = any_nonfinite(self._hyper_map, grads)
        if not skipped:
            skipped = ops.depend(skipped, self._inner(grads))
        if self._dynamic:
            skipped = self._updater(self._scale, skipped)
        return skipped

    def apply_gradients(self, grads):
        """Keras spelling of calling the optimizer: apply unless non-finite, update the scale."""
        return self(grads)

    @property
    def loss_scale(self):
        """The current loss scale as a float32 scalar Tensor (one host sync)."""
        return Tensor(self._scale.asnumpy())

    @property
    def dynamic(self):
        """Whether the loss scale is updated dynamically."""
        return self._dynamic

    @property
    def dynamic_counter(self):
        """Consecutive finite steps since the scale last changed (None if not dynamic; one sync)."""
        return self._updater.get_state().good_steps if self._dynamic else None

    @property
    def dynamic_growth_steps(self):
        """Finite steps per doubling (None if not dynamic)."""
        return self._policy.growth_interval if self._dynamic else None

    @property
    def initial_scale(self):
        """The initial loss scale (the fixed scale when not dynamic)."""
        return self._policy.init_scale

    @property
    def inner_optimizer(self):
        """The wrapped optimizer."""
        return self._inner

    @property
    def learning_rate(self):
        """The inner optimizer's learning rate (delegated)."""
        return self._inner.learning_rate

    @learning_rate.setter
    def learning_rate(self, value):
        if isinstance(value, (int, float)):
            self._inner.learning_rate.set_data(Tensor(np.float32(value)))
        else:
            self._inner.learning_rate = value

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            inner = self.__dict__.get("_cells", {}).get("_inner")
            if inner is None or name.startswith("__"):
                raise
            return getattr(inner, name)
