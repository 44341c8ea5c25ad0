"""Overflow detection per backend: which check runs where, and the graph pieces of each.

Checks (names returned by :func:`choose_overflow_check`):

``"isfinite"`` (CPU; generic)
    Exact inf/nan test giving one float32 scalar, 0 when every value is finite
    and nan otherwise (``0 * inf`` and ``0 * nan`` are nan, ``0 * x`` is 0 for any
    finite x, however large):

    - each float32/float16 gradient with at least :data:`GEMV_PROBE_MIN_SIZE`
      values is reduced to one row, ``zeros(1, rows) @ g.reshape(rows, -1)``;
    - each row, and every smaller gradient (as float32; a float64 one is
      multiplied by 0 first), gives ``reduce_sum(v * 0)``; the scalars are added.

    Why: on CPU, MindSpore's full ``ReduceSum`` over a large vector is slow and
    ``g * 0`` writes a temporary; the matrix-vector product reads the gradient
    once, multithreaded (about 3x faster on the MLP's 1024x1024 gradient). Small
    tensors are not worth a matrix product (each adds a kernel build to the first
    call). Summing the raw values is not exact (large finite values
    can overflow), and ``isfinite(max|g|)`` misses nan on CPU. Exactness is tested
    on inf, -inf and nan at several positions, shapes and dtypes
    (tests/test_overflow.py).
``"float_status"`` (GPU)
    ``ops.FloatStatus`` per gradient (1.0 if it holds inf/nan), summed; MindSpore's GPU path.
``"ascend_saturation"`` (Ascend 910A; 910B+ with ``MS_ASCEND_CHECK_OVERFLOW_MODE=SATURATION_MODE``)
    The NPU's sticky float-status register: ``NPUClearFloatStatusV2`` after the loss
    and before backward, ``NPUGetFloatStatusV2`` after the gradients.
``"ascend_allfinite"`` (Ascend 910B+ in INFNAN mode, the default there)
    MindSpore's fused ``AllFinite`` kernel. Despite its name its output is True
    when some gradient is NOT finite: verified in MindSpore 2.10's source, where
    ``mindspore/amp.py`` computes ``status_finite = ~AllFinite()(inputs)`` and
    ``nn/wrap/loss_scale.py`` uses ``AllFinite()(grads)`` as the overflow flag.
    The kernel does not exist on CPU, so this project has not run it.

Only ``"isfinite"`` has been run by this project (CPU). The GPU and Ascend
branches are built from MindSpore 2.10's own train cell and are covered here by
strategy-selection and graph-construction tests only.
"""
import os

from mindspore import ops
from mindspore.common import dtype as mstype
from mindspore.common.sparse_tensor import RowTensorInner

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
        >>> choose_overflow_check("CPU"), choose_overflow_check("Ascend", "SATURATION_MODE")
        ('isfinite', 'ascend_saturation')
    """
    if device_target not in DEVICE_TARGETS:
        raise ValueError(f"'device_target' must be one of {DEVICE_TARGETS}, but got {device_target!r}.")
    if ascend_mode is not None and ascend_mode not in ASCEND_MODES:
        raise ValueError(f"'ascend_mode' (MS_ASCEND_CHECK_OVERFLOW_MODE) must be one of {ASCEND_MODES} "
                         f"or unset, but got {ascend_mode!r}.")
    if device_target == "CPU":
        return ISFINITE
    if device_target == "GPU":
        return FLOAT_STATUS
    if ascend_saturation_only or ascend_mode == "SATURATION_MODE":
        return ASCEND_SATURATION
    return ASCEND_ALLFINITE


def current_overflow_check():
    """The check for the current MindSpore context and environment (see :func:`choose_overflow_check`)."""
    import mindspore as ms

    device_target = ms.get_context("device_target")
    ascend_saturation_only = False
    if device_target == "Ascend":  # pragma: no cover - needs an NPU
        from mindspore._c_expression import MSContext

        ascend_saturation_only = MSContext.get_instance().ascend_soc_supports_feature(
            "amp_loss_scale_train_classic_target")
    return choose_overflow_check(device_target, os.environ.get("MS_ASCEND_CHECK_OVERFLOW_MODE") or None,
                                 ascend_saturation_only)


# ---- graph pieces ---------------------------------------------------------------------------
GEMV_PROBE_MIN_SIZE = 1 << 16


def _uses_gemv(grad):
    dtype = ops.dtype(grad)
    return (dtype == mstype.float32 or dtype == mstype.float16) and grad.size >= GEMV_PROBE_MIN_SIZE


def _gemv_probe(grad):
    """``zeros(1, rows) @ grad.reshape(rows, -1)``: a row of 0 (all finite) or nan values."""
    matrix = grad.reshape(grad.shape[0], -1) if len(grad.shape) > 1 else grad.reshape(1, -1)
    return ops.matmul(ops.zeros((1, matrix.shape[0]), ops.dtype(grad)), matrix)


def _exact_float32(values):
    """``values`` as float32 without creating or losing a non-finite value.

    float16 and bfloat16 convert exactly; wider dtypes are multiplied by 0 first, since a
    large finite float64 would become inf in float32.
    """
    dtype = ops.dtype(values)
    if dtype == mstype.float32:
        return values
    if dtype == mstype.float16 or dtype == mstype.bfloat16:
        return ops.cast(values, mstype.float32)
    return ops.cast(values * 0, mstype.float32)


def _probe_values(grad):
    """A float32 vector, all finite iff ``grad`` is: a large gradient's GEMV row, else its values."""
    if _uses_gemv(grad):
        return _exact_float32(_gemv_probe(grad).reshape(-1))
    return _exact_float32(grad.reshape(-1))


_nonfinite_probe = ops.MultitypeFuncGraph("_nonfinite_probe")


@_nonfinite_probe.register("Tensor")
def _tensor_nonfinite_probe(grad):
    """A float32 scalar: 0 if every value of ``grad`` is finite, else nan."""
    return ops.reduce_sum(_probe_values(grad) * 0)


@_nonfinite_probe.register("RowTensor")
def _row_tensor_nonfinite_probe(grad):
    # Sparse values can have a dynamic shape, so no size-dependent choice: their values as they are.
    return ops.reduce_sum(_exact_float32(grad.values.reshape(-1)) * 0)


_float_status = ops.MultitypeFuncGraph("_float_status")


@_float_status.register("Tensor")
def _tensor_float_status(grad):
    return ops.FloatStatus()(grad).reshape(())


@_float_status.register("RowTensor")
def _row_tensor_float_status(grad):
    return _tensor_float_status(grad.values)


_unscale = ops.MultitypeFuncGraph("_unscale")


@_unscale.register("Tensor", "Tensor")
def _tensor_unscale(inv_scale, grad):
    """``grad * (1/scale)`` computed in float32 and cast back: exact for float16 at any scale."""
    if ops.dtype(grad) == mstype.float32:
        return grad * inv_scale
    return ops.cast(ops.cast(grad, mstype.float32) * inv_scale, ops.dtype(grad))


@_unscale.register("Tensor", "RowTensor")
def _row_tensor_unscale(inv_scale, grad):
    return RowTensorInner(grad.indices, _tensor_unscale(inv_scale, grad.values), grad.dense_shape)


def unscale_gradients(hyper_map, inv_scale, grads):
    """Multiply every gradient by the float32 ``inv_scale`` (graph mode)."""
    return hyper_map(ops.partial(_unscale, inv_scale), grads)


def _total(scalars):
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
    ``reduce_sum(v * 0)``, and those scalars are added.
    """
    return _total(hyper_map(_nonfinite_probe, grads))


def any_nonfinite(hyper_map, grads):
    """A bool scalar: True when some gradient holds inf/nan (exact; graph mode)."""
    return ops.logical_not(ops.isfinite(nonfinite_indicator(hyper_map, grads)))


_nonfinite_flag = ops.MultitypeFuncGraph("_nonfinite_flag")


@_nonfinite_flag.register("Tensor")
def _tensor_nonfinite_flag(grad):
    return ops.logical_not(ops.isfinite(_tensor_nonfinite_probe(grad)))


def nonfinite_per_tensor(hyper_map, grads):
    """A tuple of bool scalars, one per gradient: True where it holds inf/nan (graph mode)."""
    return hyper_map(_nonfinite_flag, grads)


def float_status_indicator(hyper_map, grads):
    """A float32 scalar >= 1 when some gradient is inf/nan (GPU ``FloatStatus``; graph mode)."""
    return _total(hyper_map(_float_status, grads))
