"""Overflow detection per backend: which check runs where, and the graph pieces of each.

Checks (names returned by :func:`choose_overflow_check`):

``"isfinite"`` (CPU; generic)
    Exact inf/nan test: one scalar per gradient, 0 when every value is finite
    and nan otherwise, combined with one ``AddN`` and one ``isfinite``.

    - float32 and float16: ``zeros(1, rows) @ g.reshape(rows, -1)``, then the sum
      of that row. Every output is a sum of ``0 * g`` terms, and ``0 * inf`` and
      ``0 * nan`` are nan, so no finite value, however large, can give a false
      overflow. On CPU this single matrix-vector product is about 3x faster than
      ``reduce_sum(g * 0)``: MindSpore's full ``ReduceSum`` over a large vector is
      the slow part, and the product also avoids writing a ``g * 0`` temporary.
    - other dtypes (bfloat16, float64): ``reduce_sum((g * 0).reshape(-1))``.

    Summing the raw values is not exact (large finite values can overflow), and
    ``isfinite(max|g|)`` misses nan on CPU. The exactness of every branch is
    tested on inf, -inf and nan at several positions (tests/test_overflow.py).
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

_nonfinite_probe = ops.MultitypeFuncGraph("_nonfinite_probe")


@_nonfinite_probe.register("Tensor")
def _tensor_nonfinite_probe(grad):
    """A float32 scalar: 0 if every value of ``grad`` is finite, else nan (see the module docstring)."""
    dtype = ops.dtype(grad)
    if dtype == mstype.float32 or dtype == mstype.float16:
        matrix = grad.reshape(grad.shape[0], -1) if len(grad.shape) > 1 else grad.reshape(1, -1)
        zero_row = ops.zeros((1, matrix.shape[0]), dtype)
        return ops.cast(ops.reduce_sum(ops.matmul(zero_row, matrix)), mstype.float32)
    return ops.cast(ops.reduce_sum((grad * 0).reshape(-1)), mstype.float32)


@_nonfinite_probe.register("RowTensor")
def _row_tensor_nonfinite_probe(grad):
    return _tensor_nonfinite_probe(grad.values)


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
    return ops.cast(ops.cast(grad, mstype.float32) * inv_scale, ops.dtype(grad))


@_unscale.register("Tensor", "RowTensor")
def _row_tensor_unscale(inv_scale, grad):
    return RowTensorInner(grad.indices, _tensor_unscale(inv_scale, grad.values), grad.dense_shape)


def unscale_gradients(hyper_map, inv_scale, grads):
    """Multiply every gradient by the float32 ``inv_scale`` (graph mode)."""
    return hyper_map(ops.partial(_unscale, inv_scale), grads)


def nonfinite_indicator(hyper_map, grads):
    """A float32 scalar that is 0 when every gradient is finite and nan otherwise (graph mode)."""
    return ops.addn(hyper_map(_nonfinite_probe, grads))


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
    return ops.addn(hyper_map(_float_status, grads))
