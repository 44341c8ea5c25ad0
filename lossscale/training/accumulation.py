"""Gradient accumulation for the train cell: float32 accumulators and the window's overflow flag.

With ``accumulation_steps=N`` each call of the train cell is one micro-batch: its unscaled gradients are added to
float32 accumulators (``loss_scale_accumulator.<param>``; float64 for a float64 parameter) and its overflow flag to
the window's (``loss_scale_window_overflow``). On the N-th call the accumulators' mean goes through the rest of the
step (one all-reduce, one scale update, one optimizer step or skip) and the window is reset. All state is in
Parameters, so a checkpoint taken mid-window resumes it.

Example:
    >>> from mindspore import nn
    >>> window = GradientAccumulation(nn.Dense(2, 1).trainable_params(), steps=4)
    >>> [p.name for p in window.get_parameters()][-2:]
    ['loss_scale_micro_step', 'loss_scale_window_overflow']
"""

import numpy as np
from mindspore import Parameter, ParameterTuple, Tensor, nn, ops
from mindspore.common import dtype as mstype

from lossscale.core._validation import check_int_in_range

_accumulate = ops.MultitypeFuncGraph("_accumulate")


@_accumulate.register("Tensor", "Tensor")
def _tensor_accumulate(accumulator, grad):
    return ops.assign_add(accumulator, ops.cast(grad, ops.dtype(accumulator)))


_mean_of = ops.MultitypeFuncGraph("_mean_of")


@_mean_of.register("Tensor", "Tensor", "Tensor", "Tensor")
def _tensor_mean_of(count, inverse_count, accumulator, weight):
    """``accumulator / count`` in ``weight``'s dtype: times the float32 ``1/count``, or divided in float64."""
    if ops.dtype(accumulator) == mstype.float64:
        return ops.cast(accumulator / ops.cast(count, mstype.float64), ops.dtype(weight))
    return ops.cast(accumulator * inverse_count, ops.dtype(weight))


_reset = ops.MultitypeFuncGraph("_reset")


@_reset.register("Tensor")
def _tensor_reset(accumulator):
    return ops.assign(accumulator, ops.zeros_like(accumulator))


def _accumulator_dtype(weight):
    """float64 for a float64 weight (no precision lost), else float32 (float16 sums would overflow)."""
    return np.float64 if weight.dtype == mstype.float64 else np.float32


def counter(name, value=0, dtype=mstype.int32):
    """A scalar state Parameter (no gradient) named ``name``."""
    return Parameter(Tensor(value, dtype), name=name, requires_grad=False)


class GradientAccumulation(nn.Cell):
    """The accumulation window of a train cell (graph methods; the train cell sequences them).

    Args:
        weights: the trainable Parameters (one float32 accumulator each; float64 for a float64 one).
        steps (int): micro-batches per optimizer step, >= 2.
    """

    def __init__(self, weights, steps):
        super().__init__(auto_prefix=False)
        self.steps = check_int_in_range("accumulation_steps", steps, low=2)
        self.hyper_map = ops.HyperMap()
        self.accumulators = ParameterTuple(
            [
                Parameter(
                    Tensor(np.zeros(p.shape, _accumulator_dtype(p))),
                    name=f"loss_scale_accumulator.{p.name}",
                    requires_grad=False,
                )
                for p in weights
            ]
        )
        self.micro_step = counter("loss_scale_micro_step")
        self.window_overflow = counter("loss_scale_window_overflow", 0.0, mstype.float32)
        self._inverse_count = Tensor(1.0 / self.steps, mstype.float32)
        self._window = Tensor(self.steps, mstype.int32)
        self._one = Tensor(1, mstype.int32)

    def add(self, grads, flag):
        """Add this micro-batch's gradients and flag; return ``(window flag so far, micro step, is last)``."""
        accumulated = self.hyper_map(_accumulate, self.accumulators, grads)
        window_flag = ops.depend(self.window_overflow + flag, accumulated)
        micro = self.micro_step + self._one
        return window_flag, micro, micro >= self._window

    def mean(self, weights):
        """The window's mean gradient, cast to the dtype of each of ``weights``."""
        return self.hyper_map(ops.partial(_mean_of, self._window, self._inverse_count), self.accumulators, weights)

    def carry(self, window_flag, micro):
        """Not the last micro-batch: keep the window flag and the micro step for the next call."""
        done = ops.assign(self.window_overflow, window_flag)
        return ops.depend(done, ops.assign(self.micro_step, micro))

    def reset(self):
        """The last micro-batch was consumed: zero the accumulators, the flag and the micro step."""
        done = self.hyper_map(_reset, self.accumulators)
        done = ops.depend(ops.assign(self.window_overflow, ops.zeros_like(self.window_overflow)), done)
        return ops.depend(done, ops.assign(self.micro_step, ops.zeros_like(self.micro_step)))
