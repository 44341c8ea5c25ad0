"""Clipping the unscaled gradients by their global norm, inside the train graph.

``clip_global_norm=C`` multiplies every gradient by ``C / max(norm, C)``, the formula of
``mindspore.ops.clip_by_global_norm``, where ``norm`` is the float32 L2 norm of all the
(unscaled, reduced) gradients. The norm doubles as the overflow check: it is finite iff
every gradient is finite and the sum of squares fits float32 (a norm above ~1.8e19 counts
as an overflow too).

Example:
    >>> import numpy as np
    >>> from mindspore import Tensor
    >>> clipped, bad, norm = GlobalNormClip(1.0)((Tensor(np.array([3.0, 4.0], np.float32)),))
    >>> [round(float(v), 3) for v in clipped[0].asnumpy()], float(bad), float(norm)
    ([0.6, 0.8], 0.0, 5.0)
"""

from mindspore import Tensor, nn, ops
from mindspore.common import dtype as mstype

from lossscale.core._validation import check_finite_in_range
from lossscale.core.gradients import grouped_total, is_constant, multiply_gradients, square_sum

_ZERO = Tensor(0.0, mstype.float32)

_square_sum = ops.MultitypeFuncGraph("_square_sum")


@_square_sum.register("Bool", "Tensor")
def _tensor_square_sum(through_gemv, grad):
    return square_sum(grad, through_gemv)


@_square_sum.register("Bool", "None")
def _none_square_sum(through_gemv, grad):
    """A missing gradient (``None``, as the functional front-ends pass through) adds nothing to the norm."""
    return _ZERO


def global_norm(hyper_map, grads):
    """The float32 global L2 norm of ``grads``. Large gradients are summed through a GEMV row inside a graph, and
    with ReduceSum for gradients that are constants (eagerly, in PyNative mode, where MindSpore's CPU MatMul is
    the slower one), decided at trace time by
    :func:`lossscale.core.gradients.is_constant`."""
    alone = ops.partial(_square_sum, not is_constant(grads))
    return ops.sqrt(grouped_total(hyper_map, grads, alone, _buffer_square_sum))


def _buffer_square_sum(values):
    """The sum of squares of a float32 buffer (:func:`lossscale.core.gradients.grouped_total`)."""
    return ops.reduce_sum(values * values)


class GlobalNormClip(nn.Cell):
    """``clip(grads, measured=None) -> (clipped grads, flag, norm)``; ``flag`` is 1.0 when the global norm is not
    finite. The norm is that of ``measured`` (default: ``grads``): gradients still multiplied by the loss scale, for
    an optimizer that divides by it, are clipped by the norm of their unscaled values.

    Args:
        clip_norm (float): the largest global L2 norm, finite and > 0.
    """

    def __init__(self, clip_norm):
        super().__init__(auto_prefix=False)
        self.clip_norm = check_finite_in_range("clip_global_norm", clip_norm, low=0.0, low_inclusive=False)
        self.hyper_map = ops.HyperMap()
        self._clip = Tensor(self.clip_norm, mstype.float32)
        self._zero = Tensor(0.0, mstype.float32)
        self._one = Tensor(1.0, mstype.float32)

    def norm(self, grads):
        """The float32 global L2 norm of ``grads``."""
        return global_norm(self.hyper_map, grads)

    def construct(self, grads, measured=None):
        norm = self.norm(grads if measured is None else measured)
        flag = ops.select(ops.isfinite(norm), self._zero, self._one)
        factor = self._clip / ops.maximum(norm, self._clip)  # as ops.clip_by_global_norm
        return multiply_gradients(self.hyper_map, factor, grads), flag, norm
