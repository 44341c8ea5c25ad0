"""Overflow detection: one check object per backend (docs/design.md, section 4), with MindSpore's two phases::

    status, compute_input = check.start(pre_cond, compute_input)   # after the loss, before backward
    flag = check.flag(status, compute_output)                      # after the gradients: float32, 0 = all finite
    loss = check.before_backward(loss)   # the first phase for a loss scaled inside the user's differentiated function

``"isfinite"`` (CPU and generic, exact), ``"float_status"`` (GPU), ``"ascend_saturation"`` (910A, or the saturation
mode) and ``"ascend_allfinite"`` (910B+ INFNAN mode); only ``"isfinite"`` runs on this project's machines.

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

from lossscale.core._validation import check_bool
from lossscale.core.compat import all_finite_primitive, ascend_saturation_only, ascend_status_primitives
from lossscale.core.gradients import dense_values, nonfinite_indicator, total

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
        for values in self.hyper_map(dense_values, compute_output):
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
