"""What differs between the supported MindSpore releases (2.7.1 to 2.10), in one place, each tagged with the
releases it serves.

- :func:`prefer_fast_cpu_convolutions` [2.10]: oneDNN's CPU convolution kernels on AVX-512 machines (oneDNN 3.10
  picks a much slower NCHW kernel unless limited to AVX2; docs/performance.md has the measurements).
- :func:`ascend_saturation_only` [2.10; before: ``get_ascend_soc_version``]: whether the Ascend SoC only
  saturates (the 910A).
- :func:`differentiating` [2.7.1-2.10: a private PyNative query]: whether a forward pass is being recorded for
  differentiation.
- :func:`ascend_status_primitives`, :func:`all_finite_primitive` [2.7.1-2.10: private import paths]: the Ascend
  overflow-status primitives.
- :func:`compile_again_at_next_call` [2.7.1-2.10: a Cell's private ``_create_time``]: a new graph after one raised.
"""

import functools
import os
import time

ONEDNN_ISA_VARIABLE = "ONEDNN_MAX_CPU_ISA"


def prefer_fast_cpu_convolutions():
    """Limit oneDNN to AVX2 unless the environment already says which instructions it may use.

    On a CPU with AVX-512, MindSpore 2.10's convolutions then run several times faster (see the module
    docstring). Call it at the start of a program, before its first CPU operation; setting
    ``ONEDNN_MAX_CPU_ISA=AVX2`` in the environment does the same, and ``ONEDNN_MAX_CPU_ISA=DEFAULT`` keeps
    oneDNN's own choice. No effect on a machine without AVX-512, on GPU or Ascend kernels, or once the process
    has run a CPU operation.

    Example:
        >>> import os, lossscale
        >>> lossscale.prefer_fast_cpu_convolutions()   # before the first CPU operation
        >>> "ONEDNN_MAX_CPU_ISA" in os.environ
        True
    """
    os.environ.setdefault(ONEDNN_ISA_VARIABLE, "AVX2")


# The SoC feature MindSpore >= 2.10 reports for the 910A ("classic" loss-scale training: saturation only).
_CLASSIC_FEATURE = "amp_loss_scale_train_classic_target"


def ascend_saturation_only(context=None):
    """True if the Ascend SoC supports only saturation mode (the 910A), on every supported MindSpore.

    MindSpore 2.10 answers with ``MSContext.ascend_soc_supports_feature``; earlier
    releases only have ``get_ascend_soc_version()``, which is ``"ascend910"`` on a 910A.
    ``context`` defaults to ``MSContext.get_instance()`` (a parameter so tests can pass a stand-in).

    Example:
        >>> class Older:                       # a MindSpore before 2.10 on a 910B
        ...     def get_ascend_soc_version(self):
        ...         return "ascend910b"
        >>> ascend_saturation_only(Older())
        False
    """
    if context is None:  # pragma: no cover - the real context only matters on an NPU
        from mindspore._c_expression import MSContext  # private, the only way to ask

        context = MSContext.get_instance()
    if hasattr(context, "ascend_soc_supports_feature"):
        return bool(context.ascend_soc_supports_feature(_CLASSIC_FEATURE))
    return context.get_ascend_soc_version() == "ascend910"


@functools.lru_cache(maxsize=None)
def _requires_grad_query():
    """PyNative's "is a forward pass being recorded for differentiation" (None if a MindSpore had no such query).
    Looked up at the first use: this module is imported before MindSpore by the command line (oneDNN's setting)."""
    from mindspore.common import api

    return getattr(getattr(api, "_pynative_executor", None), "requires_grad", None)


def differentiating():
    """Host: whether MindSpore is recording this forward pass for differentiation (PyNative: inside the function
    given to ``mindspore.value_and_grad``, ``grad``, ``vjp``, ...). True when MindSpore cannot say.

    Example:
        >>> differentiating()  # not inside value_and_grad
        False
    """
    query = _requires_grad_query()
    return True if query is None else bool(query())


def ascend_status_primitives():
    """``(NPUClearFloatStatusV2(), NPUGetFloatStatusV2())``: the float-status register's primitives (Ascend)."""
    from mindspore.ops.operations.math_ops import NPUClearFloatStatusV2, NPUGetFloatStatusV2

    return NPUClearFloatStatusV2(), NPUGetFloatStatusV2()


def all_finite_primitive():
    """``AllFinite()``: MindSpore's fused check of Ascend's INFNAN mode (True when some input is NOT finite)."""
    from mindspore.ops.operations.nn_ops import AllFinite

    return AllFinite()


def compile_again_at_next_call(cell):
    """Make the next call of ``cell`` (compiled in GRAPH_MODE) compile a new graph. A compiled graph that raised at
    run time fails at every later call ("An error occurred in the previous step of this model execution"), even once
    the cause is fixed; MindSpore keys a Cell's graph by its creation time, so a new one gives a new graph.

    Example:
        >>> from mindspore import nn
        >>> cell = nn.Dense(1, 1)
        >>> before = cell.create_time
        >>> compile_again_at_next_call(cell)
        >>> cell.create_time != before
        True
    """
    object.__setattr__(cell, "_create_time", max(time.time_ns(), cell.create_time + 1))
