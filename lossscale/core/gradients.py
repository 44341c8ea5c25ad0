"""Gradient arithmetic in graphs, exact: unscaling, the inf/nan probe, norms and sums (docs/design.md, section 4).

``0 * x`` is 0 for every finite x and nan for inf or nan, so :func:`nonfinite_indicator` (``sum(g * 0)`` over every
gradient, large ones through a zero-row matrix product) is exact; :func:`multiply_gradients` computes in float32
(float64 for float64 gradients) and casts back, exact for float16 at any power-of-two factor. Sums add their
scalars one by one: a tuple primitive (``AddN``) fails to infer on sparse gradients.

Example:
    >>> import numpy as np
    >>> grads = (Tensor(np.array([1.0, np.inf], np.float32)),)
    >>> float(nonfinite_indicator(ops.HyperMap(), grads))
    nan
"""

from mindspore import Tensor, ops
from mindspore.common import dtype as mstype
from mindspore.common.sparse_tensor import RowTensorInner
from mindspore.ops import constexpr
from mindspore.ops import functional as F

GEMV_PROBE_MIN_SIZE = 1 << 16
# The most values of smaller gradients probed together in one float32 buffer (4 MiB).
FLAT_GROUP_SIZE = 1 << 20
# Multiplier of the fingerprint: finite values times 2**-64 cannot overflow float32 when summed.
_FINGERPRINT_WEIGHT = 2.0**-64


# Tensor constants, not Python floats: MindSpore 2.10's specializer intermittently fails ("Fail to get eval
# result ... muls") when its shared Tensor-times-Python-float graph meets different constants across call sites.
_ZERO = Tensor(0.0, mstype.float32)
_ONE = Tensor(1.0, mstype.float32)
_NAN = Tensor(float("nan"), mstype.float32)
_FINGERPRINT = Tensor(_FINGERPRINT_WEIGHT, mstype.float32)


def _uses_gemv(grad):
    """Whether ``grad`` is large enough (and float32/float16) to be reduced through a GEMV row."""
    dtype = ops.dtype(grad)
    return (dtype == mstype.float32 or dtype == mstype.float16) and grad.size >= GEMV_PROBE_MIN_SIZE


def _gemv_row(row_values, grad):
    """``row_values @ grad.reshape(rows, -1)`` for a ``(1, rows)`` row: one pass over a large gradient."""
    matrix = grad.reshape(grad.shape[0], -1) if len(grad.shape) > 1 else grad.reshape(1, -1)
    return ops.matmul(ops.broadcast_to(row_values, (1, matrix.shape[0])), matrix)


def square_sum(grad, through_gemv=True):
    """``sum(grad ** 2)`` in float32 (0 for an empty gradient). In a graph, large gradients are summed through a
    GEMV row, several times faster than MindSpore's CPU ``ReduceSum`` of a large tensor
    (docs/design.md, section 4). Eagerly (``through_gemv=False``) MindSpore's CPU ``MatMul`` is the slower one.

    Example:
        >>> float(square_sum(Tensor([3.0, 4.0], mstype.float32), through_gemv=False))
        25.0
    """
    if is_empty(grad):
        return _ZERO
    grad = ops.cast(grad, mstype.float32)
    return float32_sum(grad * grad, through_gemv)


def float32_sum(values, through_gemv=True):
    """``sum(values)`` of a float32 Tensor; in a graph a large matrix is summed through a GEMV row (``square_sum``);
    a vector has no rows to fold, so it goes to ``ReduceSum`` directly.

    Example:
        >>> float(float32_sum(Tensor([1.0, 0.0, 1.0], mstype.float32), through_gemv=False))
        2.0
    """
    if through_gemv and values.size >= GEMV_PROBE_MIN_SIZE and len(values.shape) > 1:
        return ops.reduce_sum(_gemv_row(_ONE, values))
    return ops.reduce_sum(values)


def exact_float32(values):
    """``values`` as float32 without creating or losing a non-finite value.

    float16 and bfloat16 convert exactly; wider dtypes are multiplied by 0 first, since a
    large finite float64 would become inf in float32.
    """
    dtype = ops.dtype(values)
    if dtype == mstype.float32:
        return values
    if dtype == mstype.float16 or dtype == mstype.bfloat16:
        return ops.cast(values, mstype.float32)
    return ops.cast(values * ops.zeros_like(values), mstype.float32)


def zero_or_nan(values):
    """A float32 scalar: 0 if every value is finite, nan otherwise (``sum(v * 0)``; exact)."""
    if is_empty(values):
        return _ZERO
    return ops.reduce_sum(exact_float32(values) * _ZERO)


def is_empty(grad):
    """A zero-size gradient (shape known at compile time). MindSpore's CPU ``ReduceSum`` of an empty tensor
    returns uninitialised memory, so empty gradients are left out of every reduction."""
    return grad.size == 0


def _flat(values):
    """``values`` as a 1-D view (a full reduction over it is faster); bfloat16 values are converted to float32
    first (exactly): MindSpore's CPU ``Reshape`` has no bfloat16 kernel."""
    if ops.dtype(values) == mstype.bfloat16:
        values = ops.cast(values, mstype.float32)
    return values.reshape(-1)


def _probe(grad):
    """``zero_or_nan(grad)``, through a zero GEMV row for a large float32/float16 gradient."""
    if _uses_gemv(grad):
        return ops.reduce_sum(exact_float32(_gemv_row(ops.cast(_ZERO, ops.dtype(grad)), grad)))
    return zero_or_nan(_flat(grad))


def _weighted(grad):
    """``sum(grad * 2**-64)`` as a float32 scalar (a float32 GEMV row for a large float32 gradient).

    A float64 gradient is summed in float64 and the sum ``s`` compressed into float32's range
    (:func:`_compressed`): a plain cast would turn a finite sum beyond float32's range into inf,
    and exact_float32 would give 0."""
    if is_empty(grad):
        return _ZERO
    dtype = ops.dtype(grad)
    if dtype == mstype.float32 and grad.size >= GEMV_PROBE_MIN_SIZE:
        return ops.reduce_sum(_gemv_row(_FINGERPRINT, grad))
    if dtype == mstype.float64:
        return _compressed(ops.reduce_sum(grad.reshape(-1) * ops.cast(_FINGERPRINT, mstype.float64)))
    return ops.reduce_sum(exact_float32(_flat(grad)) * _FINGERPRINT)


def _weighted_buffer(values):
    """:func:`_weighted` of a float32 buffer."""
    return ops.reduce_sum(values * _FINGERPRINT)


def _compressed(total):
    """A float64 scalar as float32: itself where ``|total| <= 1``, else ``sign * (1 + log|total|)``.

    Monotonic, finite exactly when ``total`` is (nan stays nan), and ``S * total`` still differs
    from ``total``. Not ``log1p``: MindSpore's CPU kernel computes ``log(1 + x)``, 0 for tiny x."""
    magnitude, one = ops.abs(total), ops.ones_like(total)
    large = magnitude > one
    logarithm = ops.sign(total) * (ops.log(ops.select(large, magnitude, one)) + one)
    return ops.cast(ops.select(large, logarithm, total), mstype.float32)


_nonfinite_probe = ops.MultitypeFuncGraph("_nonfinite_probe")


@_nonfinite_probe.register("Tensor")
def _tensor_nonfinite_probe(grad):
    """A float32 scalar: 0 if every value of ``grad`` is finite, else nan."""
    return _probe(grad)


@_nonfinite_probe.register("RowTensor")
def _row_tensor_nonfinite_probe(grad):
    # Sparse values can have a dynamic shape, so no size-dependent choice: their values as they are.
    return zero_or_nan(_flat(grad.values))


@_nonfinite_probe.register("None")
def _none_nonfinite_probe(grad):
    return Tensor(0.0, mstype.float32)


_groupable_size = ops.MultitypeFuncGraph("_groupable_size")


@_groupable_size.register("Tensor")
def _tensor_groupable_size(grad):
    """The size of a non-empty float16, bfloat16 or float32 gradient below GEMV_PROBE_MIN_SIZE values (exact in a
    float32 buffer); else 0."""
    dtype = ops.dtype(grad)
    floating = dtype == mstype.float32 or dtype == mstype.float16 or dtype == mstype.bfloat16
    if not floating or is_empty(grad) or grad.size >= GEMV_PROBE_MIN_SIZE:
        return 0
    return grad.size


@_groupable_size.register("RowTensor")
@_groupable_size.register("None")
def _not_groupable(grad):
    return 0


_constant_probe = ops.MultitypeFuncGraph("_constant_probe")


@_constant_probe.register("Tensor")
def _tensor_constant_probe(grad):
    """:func:`_tensor_nonfinite_probe` for a constant gradient: 0 if every value is finite, else nan."""
    if is_empty(grad):
        return _ZERO
    if ops.dtype(grad) == mstype.bfloat16:  # MindSpore's CPU IsFinite has no bfloat16 kernel; the cast is exact
        grad = ops.cast(grad, mstype.float32)
    return ops.select(ops.isfinite(grad).all(), _ZERO, _NAN)


@_constant_probe.register("RowTensor")
def _row_tensor_constant_probe(grad):
    return _tensor_constant_probe(grad.values)


@_constant_probe.register("None")
def _none_constant_probe(grad):
    return _ZERO


_fingerprint = ops.MultitypeFuncGraph("_fingerprint")


@_fingerprint.register("Tensor")
def _tensor_fingerprint(grad):
    return _weighted(grad)


@_fingerprint.register("None")
def _none_fingerprint(grad):
    return Tensor(0.0, mstype.float32)


dense_values = ops.MultitypeFuncGraph("dense_values")


@dense_values.register("Tensor")
def _tensordense_values(grad):
    return grad


@dense_values.register("RowTensor")
def _row_tensordense_values(grad):
    return grad.values


_multiply = ops.MultitypeFuncGraph("_multiply")


@_multiply.register("Tensor", "Tensor")
def _tensor_multiply(factor, grad):
    """``grad * factor`` computed in float32 (float64 for a float64 gradient) and cast back: exact for
    float16 at any power-of-two factor; a float64 gradient keeps its precision and range (as PyTorch's)."""
    dtype = ops.dtype(grad)
    if dtype == mstype.float32:
        return grad * factor
    if dtype == mstype.float64:
        return grad * ops.cast(factor, mstype.float64)
    return ops.cast(ops.cast(grad, mstype.float32) * factor, dtype)


@_multiply.register("Tensor", "RowTensor")
def _row_tensor_multiply(factor, grad):
    return RowTensorInner(grad.indices, _tensor_multiply(factor, grad.values), grad.dense_shape)


@_multiply.register("Tensor", "None")
def _none_multiply(factor, grad):
    return grad


def multiply_gradients(hyper_map, factor, grads):
    """Every gradient times the float32 scalar ``factor`` (graph mode): ``1/S`` to unscale, the clipping
    factor to clip. None entries pass through."""
    return hyper_map(ops.partial(_multiply, factor), grads)


def total(scalars):
    """The sum of a tuple of scalars, added one by one.

    Not ``AddN`` or ``Concat``: with sparse (``RowTensor``) gradients the tuple's element types
    are still undetermined when MindSpore infers a primitive that takes the whole tuple, and
    that inference fails; element-wise additions are inferred later.
    """
    total = scalars[0]
    for scalar in scalars[1:]:
        total = total + scalar
    return total


def nonfinite_indicator(hyper_map, grads):
    """A float32 scalar that is 0 when every gradient is finite and nan otherwise (graph mode).

    Large gradients are reduced to one GEMV row each, the others a float32 buffer at a time (:func:`grouped_total`);
    each row or buffer gives ``reduce_sum(v * 0)``, and those scalars are added. Constant gradients go through
    ``isfinite`` instead (:func:`is_constant`).
    """
    if is_constant(grads):
        return total(hyper_map(_constant_probe, grads))
    return grouped_total(hyper_map, grads, _nonfinite_probe, zero_or_nan)


def grouped_total(hyper_map, grads, alone, together):
    """The sum of ``alone(g)`` over the gradients reduced alone and of ``together(buffer)`` over the others, which
    are flattened to float32 and concatenated into buffers of at most :data:`FLAT_GROUP_SIZE` values
    (:func:`probe_plan`): two kernels per buffer rather than per gradient, for models of many small tensors.
    ``together`` must be what ``alone`` computes, summed over a buffer."""
    alone_indices, groups = probe_plan(hyper_map(_groupable_size, grads))
    terms = ()
    for index in alone_indices:
        terms = terms + (alone(grads[index]),)
    for group in groups:
        flats = ()
        for index in group:
            flats = flats + (ops.cast(grads[index], mstype.float32).reshape(-1),)
        terms = terms + (together(ops.concat(flats) if len(flats) > 1 else flats[0]),)
    return total(terms)


def all_grouped(hyper_map, grads):
    """Whether :func:`grouped_total` reduces every gradient of ``grads`` in buffers (a trace-time bool)."""
    return not probe_plan(hyper_map(_groupable_size, grads))[0]


@constexpr
def probe_plan(sizes):
    """``(indices probed alone, groups of indices probed together)`` for gradients of ``sizes`` (0: not groupable):
    consecutive groupable gradients fill groups of at most FLAT_GROUP_SIZE values.

    Example:
        >>> probe_plan((10, 0, 5, FLAT_GROUP_SIZE - 15, 1))
        ((1,), ((0, 2, 3), (4,)))
    """
    alone, groups, group, filled = (), (), (), 0
    for index, size in enumerate(sizes):
        if not size:
            alone = alone + (index,)
            continue
        if group and filled + size > FLAT_GROUP_SIZE:
            groups, group, filled = groups + (group,), (), 0
        group, filled = group + (index,), filled + size
    return alone, groups + ((group,) if group else ())


def is_constant(grads):
    """Whether ``grads`` is a compile-time constant: a tuple of Tensors given to a compiled function or Cell
    without ``mindspore.mutable``, and every value outside a graph (eager calls, PyNative mode).

    MindSpore 2.10 folds arithmetic on such a constant at compile time and can lose a nan on the way
    (measured: ``reduce_sum(g * 0)`` of ``[[nan, 1.0]]`` folds to 0, ``g * 2**-64`` drops the nan), so the
    multiply-by-zero probes would miss it; ``isfinite`` folds correctly. Decided at trace time, outside
    ``HyperMap``, where ``isconstant`` of an element is always False."""
    return F.isconstant(grads)


def fingerprint(hyper_map, grads):
    """A float32 scalar that depends on the gradients' values: ``sum(g * 2**-64)`` over all of them
    (each float64 gradient's sum compressed into float32's range).

    Finite iff every gradient is finite (finite values times 2**-64 cannot overflow when
    summed). Deterministic for the same values, so two calls on the same gradients give
    the same number; :class:`lossscale.GradScaler` uses it to recognise gradients it has
    already seen. For constant gradients (:func:`is_constant`) it is nan when any value is
    not finite, whatever the folded sum says.
    """
    weighted = grouped_total(hyper_map, grads, _fingerprint, _weighted_buffer)
    if is_constant(grads):
        return weighted + nonfinite_indicator(hyper_map, grads)
    return weighted


_nonfinite_flag = ops.MultitypeFuncGraph("_nonfinite_flag")


@_nonfinite_flag.register("Tensor")
def _tensor_nonfinite_flag(grad):
    return ops.logical_not(ops.isfinite(_tensor_nonfinite_probe(grad)))


def nonfinite_per_tensor(hyper_map, grads):
    """A tuple of bool scalars, one per gradient: True where it holds inf/nan (graph mode)."""
    return hyper_map(_nonfinite_flag, grads)
