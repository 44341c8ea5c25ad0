"""Overflow detection: one check object per backend, and the exact graph pieces they are made of.

Every check is a small Cell with MindSpore's own two-phase protocol (the split of
``nn.TrainOneStepWithLossScaleCell.start_overflow_check`` / ``get_overflow_status``)::

    status, compute_input = check.start(pre_cond, compute_input)   # after the loss, before backward
    flag = check.flag(status, compute_output)                      # after the gradients
    loss = check.before_backward(loss)   # the same first phase, for a loss scaled inside the user's
                                         # differentiated function (front-ends): runs as its backward begins

``flag`` is a float32 scalar for this rank: 0 when every gradient is finite, non-zero
(a count, or nan) otherwise. Sums and all-reduces keep it non-zero, so the
distributed decision is ``all_reduce(flag) != 0`` whatever the backend.

Checks (names returned by :func:`choose_overflow_check`):

``"isfinite"`` (:class:`IsFiniteCheck`, CPU and generic)
    Exact: each float32/float16 gradient with at least :data:`GEMV_PROBE_MIN_SIZE`
    values is reduced to one row, ``zeros(1, rows) @ g.reshape(rows, -1)``; each row,
    and every smaller gradient (as float32; a float64 one is multiplied by 0 first),
    gives ``reduce_sum(v * 0)``; the scalars are added. ``0 * x`` is 0 for every
    finite x and nan for inf or nan, so the result is 0 or nan: no false overflow
    from large finite values, no missed nan. The matrix-vector product reads a
    large gradient once, multithreaded (MindSpore's CPU ``ReduceSum`` over a large
    vector is slow). Sparse (RowTensor) gradients use their values.
``"float_status"`` (:class:`FloatStatusCheck`, GPU)
    ``FloatStatus`` per gradient (1.0 if it holds inf/nan), summed: MindSpore's GPU path.
``"ascend_saturation"`` (:class:`AscendSaturationCheck`, Ascend 910A, or 910B+ with
``MS_ASCEND_CHECK_OVERFLOW_MODE=SATURATION_MODE``)
    Saturating arithmetic produces no inf, so the NPU's sticky float-status register
    is read instead: ``NPUClearFloatStatusV2`` once the loss exists and before
    backward (``start``), ``NPUGetFloatStatusV2`` once every gradient exists, then a
    second clear so the next step starts clean (``flag``).
``"ascend_allfinite"`` (:class:`AllFiniteCheck`, Ascend 910B+ in INFNAN mode, the default)
    MindSpore's fused ``AllFinite`` kernel. Despite its name its output is True when
    some gradient is NOT finite (MindSpore 2.10's ``amp.py``:
    ``status_finite = ~AllFinite()(inputs)``).

What ran where: only ``"isfinite"`` runs on this project's CPU machines with the real
kernels. Each other check takes its primitives as constructor arguments; the tests
build them with CPU stand-ins (a computable ``FloatStatus``, a host-side status
register driven by runtime ``pyfunc`` ops, an ``AllFinite`` with MindSpore's
polarity) and check the logic around the primitive: ordering of clear/get, summing,
polarity and the all-reduce. With the real NPU/GPU primitives each graph compiles on
CPU until kernel selection; none has run on a GPU or an NPU.

Example:
    >>> choose_overflow_check("CPU"), choose_overflow_check("Ascend", "SATURATION_MODE")
    ('isfinite', 'ascend_saturation')
    >>> type(make_overflow_check("isfinite")).__name__
    'IsFiniteCheck'
"""

import os

import mindspore as ms
from mindspore import Tensor, nn, ops
from mindspore.common import dtype as mstype
from mindspore.common.sparse_tensor import RowTensorInner
from mindspore.ops import functional as F

from lossscale.core._validation import check_bool
from lossscale.core.compat import all_finite_primitive, ascend_saturation_only, ascend_status_primitives

ISFINITE = "isfinite"
FLOAT_STATUS = "float_status"
ASCEND_SATURATION = "ascend_saturation"
ASCEND_ALLFINITE = "ascend_allfinite"
OVERFLOW_CHECKS = (ISFINITE, FLOAT_STATUS, ASCEND_SATURATION, ASCEND_ALLFINITE)
DEVICE_TARGETS = ("CPU", "GPU", "Ascend")
ASCEND_MODES = ("SATURATION_MODE", "INFNAN_MODE")


def choose_overflow_check(device_target, ascend_mode=None, ascend_saturation_only=False):
    """Pick the overflow check for a backend. Pure function of its arguments.

    Args:
        device_target (str): ``"CPU"``, ``"GPU"`` or ``"Ascend"``.
        ascend_mode (str, optional): ``MS_ASCEND_CHECK_OVERFLOW_MODE``
            (``"SATURATION_MODE"`` or ``"INFNAN_MODE"``); None means the SoC default.
        ascend_saturation_only (bool): the SoC only supports saturation mode (910A).

    Returns:
        One of :data:`OVERFLOW_CHECKS`.

    Example:
        >>> choose_overflow_check("GPU"), choose_overflow_check("Ascend", ascend_saturation_only=True)
        ('float_status', 'ascend_saturation')
    """
    if device_target not in DEVICE_TARGETS:
        raise ValueError(f"'device_target' must be one of {DEVICE_TARGETS}, but got {device_target!r}.")
    check_bool("ascend_saturation_only", ascend_saturation_only)
    if ascend_mode is not None and ascend_mode not in ASCEND_MODES:
        raise ValueError(
            f"'ascend_mode' (MS_ASCEND_CHECK_OVERFLOW_MODE) must be one of {ASCEND_MODES} "
            f"or unset, but got {ascend_mode!r}."
        )
    if device_target == "CPU":
        return ISFINITE
    if device_target == "GPU":
        return FLOAT_STATUS
    if ascend_saturation_only or ascend_mode == "SATURATION_MODE":
        return ASCEND_SATURATION
    return ASCEND_ALLFINITE


def current_overflow_check(context=None):
    """The check for the current MindSpore context and environment (see :func:`choose_overflow_check`).

    Example:
        >>> current_overflow_check()   # the tests run on CPU
        'isfinite'
    """
    device_target = ms.get_context("device_target")
    saturation_only = device_target == "Ascend" and ascend_saturation_only(context)
    return choose_overflow_check(
        device_target, os.environ.get("MS_ASCEND_CHECK_OVERFLOW_MODE") or None, saturation_only
    )


# ---- exact graph pieces -------------------------------------------------------------------------
GEMV_PROBE_MIN_SIZE = 1 << 16
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
    GEMV row: MindSpore's CPU ``ReduceSum`` of a 1024 x 1024 tensor takes 5.4 ms, the row 0.7 ms with the
    squares (measured). Eagerly (``through_gemv=False``) MindSpore's CPU ``MatMul`` is the slower one.

    Example:
        >>> float(square_sum(Tensor([3.0, 4.0], mstype.float32), through_gemv=False))
        25.0
    """
    if is_empty(grad):
        return _ZERO
    grad = ops.cast(grad, mstype.float32)
    if through_gemv and grad.size >= GEMV_PROBE_MIN_SIZE:
        return ops.reduce_sum(_gemv_row(_ONE, grad * grad))
    return ops.reduce_sum(grad * grad)


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


_dense_values = ops.MultitypeFuncGraph("_dense_values")


@_dense_values.register("Tensor")
def _tensor_dense_values(grad):
    return grad


@_dense_values.register("RowTensor")
def _row_tensor_dense_values(grad):
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


def unscale_gradients(hyper_map, inv_scale, grads):
    """Every gradient times ``inv_scale`` (``1/S``, float32): :func:`multiply_gradients` for unscaling."""
    return multiply_gradients(hyper_map, inv_scale, grads)


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

    Large gradients are reduced to one GEMV row each; each row or small gradient then gives
    ``reduce_sum(v * 0)``, and those scalars are added. Constant gradients go through
    ``isfinite`` instead (:func:`is_constant`).
    """
    if is_constant(grads):
        return total(hyper_map(_constant_probe, grads))
    return total(hyper_map(_nonfinite_probe, grads))


def is_constant(grads):
    """Whether ``grads`` is a compile-time constant: a tuple of Tensors given to a compiled function or Cell
    without ``mindspore.mutable``, and every value outside a graph (eager calls, PyNative mode).

    MindSpore 2.10 folds arithmetic on such a constant at compile time and can lose a nan on the way
    (measured: ``reduce_sum(g * 0)`` of ``[[nan, 1.0]]`` folds to 0, ``g * 2**-64`` drops the nan), so the
    multiply-by-zero probes would miss it; ``isfinite`` folds correctly. Decided at trace time, outside
    ``HyperMap``, where ``isconstant`` of an element is always False."""
    return F.isconstant(grads)


def any_nonfinite(hyper_map, grads):
    """A bool scalar: True when some gradient holds inf/nan (exact; graph mode)."""
    return ops.logical_not(ops.isfinite(nonfinite_indicator(hyper_map, grads)))


def fingerprint(hyper_map, grads):
    """A float32 scalar that depends on the gradients' values: ``sum(g * 2**-64)`` over all of them
    (each float64 gradient's sum compressed into float32's range).

    Finite iff every gradient is finite (finite values times 2**-64 cannot overflow when
    summed). Deterministic for the same values, so two calls on the same gradients give
    the same number; :class:`lossscale.GradScaler` uses it to recognise gradients it has
    already seen. For constant gradients (:func:`is_constant`) it is nan when any value is
    not finite, whatever the folded sum says.
    """
    weighted = total(hyper_map(_fingerprint, grads))
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


# ---- one check object per backend -------------------------------------------------------------
def initial_status():
    """The 8 x int32 status MindSpore's Ascend ops read and write (a constant elsewhere)."""
    return Tensor([0] * 8, mstype.int32)


class _ClearOnBackward(nn.Cell):
    """Identity whose backward, before anything else, clears the float-status register.

    The front-ends scale the loss inside the user's differentiated function, where a ``depend``
    on a forward-pass clear does not order the backward pass; the backward of the loss itself
    is the point between "loss computed" and "gradients computed".
    """

    def __init__(self, clear_status):
        super().__init__(auto_prefix=False)
        self.clear_status = clear_status

    def construct(self, loss):
        return loss

    def bprop(self, loss, out, dout):
        # After the loss (the whole forward pass) and once the backward pass starts; ``dout`` alone may be a
        # constant, which does not order the clear after the forward pass.
        cleared = self.clear_status(ops.depend(ops.depend(initial_status(), loss), dout))
        return (ops.depend(dout, cleared),)


def _same(loss):
    return loss


class IsFiniteCheck(nn.Cell):
    """Exact inf/nan check from stock kernels (CPU; works on every backend).

    Example:
        >>> import numpy as np
        >>> check = IsFiniteCheck()
        >>> grads = (Tensor(np.array([1.0, np.inf], np.float32)),)
        >>> float(check.flag(None, grads))
        nan
    """

    name = ISFINITE

    def __init__(self):
        super().__init__(auto_prefix=False)
        self.hyper_map = ops.HyperMap()
        self.before_backward = _same

    def start(self, pre_cond, compute_input):
        """Nothing to prepare: ``(status, compute_input)`` unchanged."""
        return initial_status(), compute_input

    def flag(self, status, compute_output):
        """0 when every tensor of ``compute_output`` is finite, nan otherwise."""
        return nonfinite_indicator(self.hyper_map, compute_output)


def _primitive(name, value):
    """``value`` if it can stand where a check's primitive goes (a callable); TypeError naming ``name`` otherwise,
    which would fail only while tracing the first step."""
    if not callable(value):
        raise TypeError(f"'{name}' must be a primitive or a callable stand-in for it, but got {type(value).__name__}.")
    return value


class FloatStatusCheck(nn.Cell):
    """GPU: ``FloatStatus`` (1.0 for a tensor holding inf/nan) per gradient, summed.

    Args:
        float_status (callable, optional): the primitive; default ``ops.FloatStatus()``.
            Tests pass a CPU-computable stand-in with the same contract.
    """

    name = FLOAT_STATUS

    def __init__(self, float_status=None):
        super().__init__(auto_prefix=False)
        self.hyper_map = ops.HyperMap()
        self.float_status = ops.FloatStatus() if float_status is None else _primitive("float_status", float_status)
        self.before_backward = _same

    def start(self, pre_cond, compute_input):
        """Nothing to prepare: ``(status, compute_input)`` unchanged."""
        return initial_status(), compute_input

    def flag(self, status, compute_output):
        """The number of tensors of ``compute_output`` that hold inf/nan (float32)."""
        counts = ()
        for values in self.hyper_map(_dense_values, compute_output):
            counts = counts + (ops.cast(self.float_status(values), mstype.float32).reshape(()),)
        return total(counts)


class AscendSaturationCheck(nn.Cell):
    """Ascend saturation mode: the sticky float-status register, cleared before backward and read after.

    Args:
        clear_status, get_status (callable, optional): ``NPUClearFloatStatusV2()`` and
            ``NPUGetFloatStatusV2()`` by default. Tests pass stand-ins driving a
            host-side register.
    """

    name = ASCEND_SATURATION

    def __init__(self, clear_status=None, get_status=None):
        super().__init__(auto_prefix=False)
        for name, given in (("clear_status", clear_status), ("get_status", get_status)):
            if given is not None:
                _primitive(name, given)
        if clear_status is None or get_status is None:
            default_clear, default_get = ascend_status_primitives()
            clear_status = clear_status or default_clear
            get_status = get_status or default_get
        self.clear_status = clear_status
        self.get_status = get_status
        self.before_backward = _ClearOnBackward(clear_status)

    def start(self, pre_cond, compute_input):
        """Clear the register once ``pre_cond`` exists; make ``compute_input`` wait for the clear."""
        status = ops.depend(initial_status(), pre_cond)
        cleared = self.clear_status(status)
        return status, ops.depend(compute_input, cleared)

    def flag(self, status, compute_output):
        """Read the register once ``compute_output`` exists, then clear it for the next step."""
        status = ops.depend(status, compute_output)
        flag = ops.cast(self.get_status(status), mstype.float32).sum()
        status = ops.depend(status, flag)
        return ops.depend(flag, self.clear_status(status))


class AllFiniteCheck(nn.Cell):
    """Ascend INFNAN mode: MindSpore's fused ``AllFinite`` (True when some input is NOT finite).

    Args:
        all_finite (callable, optional): default ``AllFinite()``; tests pass a stand-in.
    """

    name = ASCEND_ALLFINITE

    def __init__(self, all_finite=None):
        super().__init__(auto_prefix=False)
        if all_finite is None:
            all_finite = all_finite_primitive()
        self.all_finite = _primitive("all_finite", all_finite)
        self.before_backward = _same

    def start(self, pre_cond, compute_input):
        """Nothing to prepare: ``(status, compute_input)`` unchanged."""
        return initial_status(), compute_input

    def flag(self, status, compute_output):
        """1.0 when some tensor of ``compute_output`` is not finite, else 0.0."""
        return ops.cast(self.all_finite(compute_output), mstype.float32).reshape(())


CHECK_CLASSES = {
    ISFINITE: IsFiniteCheck,
    FLOAT_STATUS: FloatStatusCheck,
    ASCEND_SATURATION: AscendSaturationCheck,
    ASCEND_ALLFINITE: AllFiniteCheck,
}


def make_overflow_check(check=None):
    """A check object: ``check`` itself if it is one, the named check, or the current backend's (None).

    Example:
        >>> make_overflow_check().name
        'isfinite'
    """
    if check is None:
        check = current_overflow_check()
    if isinstance(check, str):
        if check not in CHECK_CLASSES:
            raise ValueError(f"'overflow_check' must be one of {OVERFLOW_CHECKS} or a check object, but got {check!r}.")
        return CHECK_CLASSES[check]()
    if not (isinstance(check, nn.Cell) and hasattr(check, "start") and hasattr(check, "flag")):
        raise TypeError(
            f"'overflow_check' must be one of {OVERFLOW_CHECKS} or a check Cell with start() and "
            f"flag() methods, but got {type(check).__name__}."
        )
    return check
