"""Host-side writes to Parameters that compiled graphs keep seeing, and reads that also work in graphs.

On MindSpore 2.10, ``Parameter.set_data`` (and ``assign_value``) after a ``mindspore.jit``
function using the Parameter was compiled gives the Parameter a new buffer while the compiled
function keeps the old one: later calls ignore the write and the host no longer sees the graph's
updates (measured on CPU; a Cell called directly rebinds and is not affected). ``ops.assign``
writes in place, so every host-side write of lossscale's state goes through :func:`write_parameter`.
"""

import numpy as np
from mindspore import Tensor, ops
from mindspore.ops import functional as F


def host_array(value):
    """``value`` (a Tensor or Parameter, a NumPy value or a Python number) as a NumPy array, one host sync for a
    Tensor. The array may share the Tensor's buffer: copy it to keep a value across a later write.

    Example:
        >>> host_array(Tensor(np.array([3], np.int32))).tolist(), host_array(2.5).tolist()
        ([3], 2.5)
    """
    return np.asarray(value.asnumpy() if hasattr(value, "asnumpy") else value)


def host_flags(value):
    """``value`` as a non-empty NumPy bool array if it is a bool, a NumPy bool, or a bool Tensor or array (one host
    sync for a Tensor); else None, for the caller's TypeError (a truthy ``"no"``, 1 or None is not a flag).

    Example:
        >>> host_flags(Tensor(np.array([True, False]))).tolist(), host_flags(1)
        ([True, False], None)
    """
    if not isinstance(value, (bool, np.bool_, np.ndarray, Tensor)):
        return None
    array = host_array(value)
    return array if array.dtype == np.bool_ and array.size else None


def write_parameter(parameter, value):
    """Write ``value`` into ``parameter`` in place (same shape and dtype; no graph rebuild, one host sync).

    Example:
        >>> from mindspore import Parameter
        >>> p = Parameter(Tensor(np.float32(1.0)), name="doc_write")
        >>> write_parameter(p, 3.0); float(p.asnumpy())
        3.0
    """
    ops.assign(parameter, Tensor(np.array(np.broadcast_to(host_array(value), parameter.shape)), parameter.dtype))


def outside_graph(parameter):
    """True when called from Python, False inside a compiled function (``mindspore.jit``, a Cell's
    ``construct``), decided at trace time: outside a graph every value is a constant, inside one a Parameter
    never is. Lets one function do host work (a sync, an identity check) only where it can run.

    Example:
        >>> from mindspore import Parameter
        >>> outside_graph(Parameter(Tensor(np.float32(1.0)), name="doc_outside"))
        True
    """
    return F.isconstant(parameter)


def read_scalar(parameter, host_value=None):
    """A one-value Parameter's value: eagerly ``host_value`` if given (no sync), else the Parameter's value as a
    Python number (a float, or an int for an integer Parameter; one host sync); inside a compiled function
    (``mindspore.jit``, a Cell's ``construct``) a scalar Tensor read when the graph runs (no sync), so that
    arithmetic on it follows the Parameter instead of freezing the value it had at compile time. Which of the
    two: :func:`outside_graph`.

    Example:
        >>> from mindspore import Parameter
        >>> read_scalar(Parameter(Tensor(np.float32(2.0)), name="doc_read")), read_scalar(
        ...     Parameter(Tensor(np.int32(7)), name="doc_read_int"))
        (2.0, 7)
    """
    if outside_graph(parameter):
        return parameter.asnumpy().reshape(-1)[0].item() if host_value is None else host_value
    return parameter.reshape(())
