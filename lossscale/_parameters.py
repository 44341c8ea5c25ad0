"""Host-side writes to Parameters that compiled graphs keep seeing.

On MindSpore 2.10, ``Parameter.set_data`` (and ``assign_value``) after a ``mindspore.jit``
function using the Parameter was compiled gives the Parameter a new buffer while the compiled
function keeps the old one: later calls ignore the write and the host no longer sees the graph's
updates (measured on CPU; a Cell called directly rebinds and is not affected). ``ops.assign``
writes in place, so every host-side write of lossscale's state goes through :func:`write_parameter`.
"""
import numpy as np
from mindspore import Tensor, ops


def write_parameter(parameter, value):
    """Write ``value`` into ``parameter`` in place (same shape and dtype; no graph rebuild, one host sync).

    Example:
        >>> from mindspore import Parameter
        >>> p = Parameter(Tensor(np.float32(1.0)), name="doc_write")
        >>> write_parameter(p, 3.0); float(p.asnumpy())
        3.0
    """
    array = value.asnumpy() if isinstance(value, Tensor) else np.asarray(value)
    ops.assign(parameter, Tensor(np.array(np.broadcast_to(array, parameter.shape)), parameter.dtype))
