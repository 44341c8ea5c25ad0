"""Gradient diagnostics: what float16 does to a model's gradients at a given loss scale.

Used by ``python -m lossscale compare`` (underflow column, the largest safe scale
of every step) and ``inspect`` (histogram against the float16 range). Everything
here syncs the host: it is for analysis, not for the training hot path.
"""

import math

import numpy as np
from mindspore import ParameterTuple, Tensor, nn, ops
from mindspore.common import dtype as mstype
from mindspore.train import Callback

FP16_MAX = 65504.0
FP16_OVERFLOW = 65520.0  # the smallest value that rounds to inf in float16
FP16_MIN_NORMAL = 2.0**-14
FP16_MIN_SUBNORMAL = 2.0**-24


class GradientProbe(nn.Cell):
    """Gradients of a network-with-loss w.r.t. its trainable weights, for a given loss scale.

    ``probe(*inputs, scale)`` back-propagates ``loss * scale`` (sens in the loss
    dtype, as the train cell does) and returns the raw scaled gradients; divide by
    the scale on the host (:func:`unscaled_gradients`).

    Example:
        >>> import numpy as np
        >>> from mindspore import Tensor, nn
        >>> probe = GradientProbe(nn.WithLossCell(nn.Dense(3, 1, weight_init="ones"), nn.MSELoss()))
        >>> batch = (Tensor(np.ones((1, 3), np.float32)), Tensor(np.zeros((1, 1), np.float32)))
        >>> grads = unscaled_gradients(probe, batch, 8.0)
        >>> [g.shape for g in grads]
        [(1, 3), (1,)]
    """

    def __init__(self, network_with_loss):
        super().__init__(auto_prefix=False)
        self.network = network_with_loss
        self.weights = ParameterTuple(network_with_loss.trainable_params())
        self.grad = ops.GradOperation(get_by_list=True, sens_param=True)

    def construct(self, *inputs_and_scale):
        inputs = inputs_and_scale[:-1]
        scale = inputs_and_scale[-1]
        loss = self.network(*inputs)
        sens = ops.ones_like(loss) * ops.cast(scale, ops.dtype(loss))
        return self.grad(self.network, self.weights)(*inputs, sens)


def unscaled_gradients(probe, inputs, scale):
    """Run ``probe`` at ``scale`` and return float64 numpy gradients divided by the scale."""
    grads = probe(*inputs, Tensor(scale, mstype.float32))
    return [g.asnumpy().astype(np.float64) / scale for g in grads]


def lost_fraction(reference, candidate):
    """Fraction of elements nonzero in ``reference`` (fp32 gradients) but zero in ``candidate``.

    Example:
        >>> lost_fraction([np.array([1.0, 2.0, 0.0])], [np.array([0.0, 2.0, 0.0])])
        0.5
    """
    nonzero = sum(int(np.count_nonzero(r)) for r in reference)
    lost = sum(int(np.count_nonzero((r != 0) & (c == 0))) for r, c in zip(reference, candidate))
    return lost / nonzero if nonzero else 0.0


def magnitude_report(grads, scale):
    """Where ``|g| * scale`` lands in float16 for the nonzero elements of ``grads`` (fp32 reference values).

    Each value is rounded to float16 as a cast does (to nearest, ties to even). Returns a dict
    with the fractions that round to 0 (``flushed``: at most half the smallest subnormal), to a
    subnormal (``subnormal``: reduced precision), to a normal number (``normal``) and to inf
    (``overflow``: 65520 and above; 65504 is the largest finite value), and
    ``largest_safe_scale``: the largest power of two at which the largest gradient stays finite.

    Example:
        >>> r = magnitude_report([np.array([2.0**-30, 1.0])], scale=1.0)
        >>> r["flushed"], r["normal"], r["largest_safe_scale"]
        (0.5, 0.5, 32768.0)
    """
    values = np.abs(np.concatenate([np.ravel(g) for g in grads]).astype(np.float64))
    values = values[values > 0]
    if not values.size:
        return {
            "flushed": 0.0,
            "subnormal": 0.0,
            "normal": 0.0,
            "overflow": 0.0,
            "largest_safe_scale": None,
            "count": 0,
        }
    with np.errstate(over="ignore"):
        rounded = (values * scale).astype(np.float16)
    flushed, overflow = rounded == 0, np.isinf(rounded)
    subnormal = (rounded > 0) & (rounded < FP16_MIN_NORMAL)
    return {
        "flushed": float(flushed.mean()),
        "subnormal": float(subnormal.mean()),
        "normal": float((~flushed & ~subnormal & ~overflow).mean()),
        "overflow": float(overflow.mean()),
        "largest_safe_scale": _largest_finite_power_of_two(values.max()),
        "count": int(values.size),
    }


def _largest_finite_power_of_two(largest):
    """The largest ``2**e`` with ``largest * 2**e`` finite in float16 (below 65520, which rounds to inf)."""
    exponent = math.floor(math.log2(FP16_OVERFLOW / largest))
    while largest * 2.0**exponent >= FP16_OVERFLOW:
        exponent -= 1
    return 2.0**exponent


def largest_safe_exponent(finite_at, guess, low=0, high=64):
    """The largest ``e`` in ``[low, high]`` with ``finite_at(e)``, or None if ``finite_at(low)`` is false.

    Finiteness is taken to fall once as ``e`` rises (scaled gradients grow with the scale). The search gallops
    from ``guess`` (the previous step's answer: usually two calls) and then bisects.

    Example:
        >>> largest_safe_exponent(lambda e: e <= 29, guess=24)
        29
    """
    guess = min(max(guess, low), high)
    if finite_at(guess):
        good, stride = guess, 1
        while good < high and finite_at(min(good + stride, high)):
            good, stride = min(good + stride, high), 2 * stride
        bad = min(good + stride, high + 1)
    else:
        bad, stride = guess, 1
        while bad > low and not finite_at(max(bad - stride, low)):
            bad, stride = max(bad - stride, low), 2 * stride
        if bad == low:
            return None
        good = max(bad - stride, low)
    while bad - good > 1:
        middle = (good + bad) // 2
        good, bad = (middle, bad) if finite_at(middle) else (good, middle)
    return good


class SafeScaleProbe(Callback):
    """Measures, before every ``every``-th training step (the first included), the largest power-of-two loss scale
    at which that step's gradients would have been finite: the step's weights and batch, back-propagated through the
    train cell's own network at ``2**e`` (:func:`largest_safe_exponent`). ``measured`` holds ``(step, scale)``
    pairs, steps counted from 1 (scale None: overflow even at scale 1).

    A step overflows exactly when its scale is above its measured value: the results page's test checks it.
    """

    def __init__(self, every=1):
        super().__init__()
        self.every, self.measured = every, []
        self._probe, self._exponent = None, 24

    def on_train_step_begin(self, run_context):
        arguments = run_context.original_args()
        if (arguments.cur_step_num - 1) % self.every:
            return
        if self._probe is None:
            self._probe = GradientProbe(arguments.train_network.network)
        inputs = arguments.train_dataset_element

        def finite_at(exponent):
            grads = self._probe(*inputs, Tensor(2.0**exponent, mstype.float32))
            return all(np.isfinite(g.asnumpy()).all() for g in grads)

        exponent = largest_safe_exponent(finite_at, self._exponent)
        self._exponent = self._exponent if exponent is None else exponent
        self.measured.append((arguments.cur_step_num, None if exponent is None else 2.0**exponent))
