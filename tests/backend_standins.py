"""CPU stand-ins for the GPU and Ascend overflow primitives, to test the logic around them.

- :class:`FloatStatusStandIn`: ``ops.FloatStatus``'s contract (float (1,), 1.0 if the tensor holds
  inf/nan) computed with CPU ops.
- :class:`AllFiniteStandIn`: ``AllFinite``'s contract (a bool, True when some input is NOT finite).
- :class:`StatusRegister`: the NPU's sticky float-status register, kept on the host and driven by
  runtime ``pyfunc`` ops: ``clear_status`` zeroes it, ``get_status`` reads it (8 x int32), and
  ``saturating_backward`` is an identity op whose backward saturates at +-65504 instead of
  overflowing, setting the register, as Ascend's saturation mode does; ``forward_saturation``
  multiplies by a large factor and saturates in the forward pass. Every event is appended to
  :attr:`StatusRegister.log` in the order it ran.
"""

import numpy as np
from mindspore import Parameter, Tensor, nn, ops
from mindspore.common import dtype as mstype

FP16_MAX = 65504.0


class FloatStatusStandIn(nn.Cell):
    def construct(self, x):
        return ops.cast(ops.logical_not(ops.isfinite(x).all()), ops.dtype(x)).reshape((1,))


class AllFiniteStandIn(nn.Cell):
    def construct(self, grads):
        finite = ()
        for grad in grads:
            finite = finite + (ops.isfinite(grad).all(),)
        return ops.logical_not(ops.stack(finite).all())


def _same(x):
    return x


def _first_of_three(x, out, dout):
    return x


class StatusRegister:
    """A host-side float-status register with MindSpore-op accessors (see the module docstring)."""

    def __init__(self, forward_factor=1e5):
        self.bits = np.zeros(8, np.int32)
        self.log = []
        self.forward_factor = np.float32(forward_factor)
        self.clear_status = ops.Custom(self._clear, out_shape=_same, out_dtype=_same, func_type="pyfunc")
        self.get_status = ops.Custom(self._get, out_shape=_same, out_dtype=_same, func_type="pyfunc")
        backward = ops.Custom(
            self._saturating_backward, out_shape=_first_of_three, out_dtype=_first_of_three, func_type="pyfunc"
        )

        def bprop(x, out, dout):
            return (backward(x, out, dout),)

        self.saturating_backward = ops.Custom(
            self._forward, out_shape=_same, out_dtype=_same, func_type="pyfunc", bprop=bprop
        )
        self.forward_saturation = ops.Custom(
            self._saturating_forward, out_shape=_same, out_dtype=_same, func_type="pyfunc"
        )

    def _saturate(self, values, event):
        saturated = np.clip(values, -FP16_MAX, FP16_MAX).astype(np.float32)
        if not np.array_equal(saturated, values):
            self.bits[0] = 1
        self.log.append(event)
        return saturated

    def _clear(self, status):
        self.bits[:] = 0
        self.log.append("clear")
        return status

    def _get(self, status):
        self.log.append("get")
        return self.bits.copy()

    def _forward(self, x):
        self.log.append("forward")
        return x

    def _saturating_forward(self, x):
        return self._saturate(x * self.forward_factor, "forward")

    def _saturating_backward(self, x, out, dout):
        return self._saturate(dout, "backward")


class SaturatingNet(nn.Cell):
    """``loss = mean(w * x)`` with ``w`` read through ``register.saturating_backward``: the gradient
    of ``w`` is ``S * x / 3`` saturated (finite) where it exceeds 65504, so it saturates for a large
    ``x`` or scale. With ``forward=True`` the forward pass saturates too (a forward overflow,
    which the check must not count)."""

    def __init__(self, register, forward=False):
        super().__init__()
        self.register = register
        self.forward = forward
        self.w = Parameter(Tensor(np.ones(3, np.float32)), name="w")

    def construct(self, x):
        y = self.register.saturating_backward(self.w) * x
        if self.forward:
            y = y + ops.stop_gradient(self.register.forward_saturation(y)) * 0
        return y.mean()


def status_input():
    return Tensor(np.zeros(8, np.int32), mstype.int32)
