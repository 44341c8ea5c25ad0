"""What the front-ends refuse where the gradients go, while a compiled function is traced or at the call from
Python: not a tuple or list of gradients, entries that cannot be gradients, sparse gradients. Each error names the
argument and the entry, and says what to give instead.

Example:
    >>> refuse_non_gradients((Tensor(np.float32(1.0)),), "grads")
    True
"""

import numpy as np
from mindspore import Tensor, nn, ops
from mindspore.ops import constexpr
from mindspore.ops import functional as F


# check=False: only the kind of ``grads`` matters here, never the values of its tensors, which inside a graph are not
# constants; MindSpore would otherwise log "is a constexpr function. The input arguments must be all constant value"
# at every compilation of the user's step.
@constexpr(check=False)
def refuse_non_gradients(grads, argument, allow_empty=False):
    """TypeError, at trace time inside a graph, unless ``grads`` (given to a front-end where the gradients go) is
    a tuple or list of gradients: :func:`refuse_non_sequence`, then :func:`refuse_non_tensor_entries`.

    Example:
        >>> refuse_non_gradients((Tensor(np.float32(1.0)),), "grads")
        True
    """
    refuse_non_sequence(grads, argument, allow_empty)
    return refuse_non_tensor_entries(grads, argument)


def refuse_non_sequence(grads, argument, allow_empty=False):
    """TypeError, at trace time inside a graph, unless ``grads`` is a tuple or list. One Tensor is Paddle's habit
    ``minimize(optimizer, scaled_loss)``; an optimizer is PyTorch's ``unscale_(optimizer)``/``step(optimizer,
    ...)``: both frameworks find the gradients on the optimizer, while MindSpore's are values. An empty one is a
    ValueError unless ``allow_empty`` (there is nothing to check, and the optimizer needs a gradient per
    parameter).

    Example:
        >>> refuse_non_sequence([], "grads", allow_empty=True)
        True
    """
    if isinstance(grads, Tensor):
        raise TypeError(
            f"'{argument}' must be a tuple or list of gradients, one per parameter of the optimizer (what "
            f"mindspore.value_and_grad returns for them), but got a single Tensor. MindSpore gradients "
            f"are values: differentiate the scaled loss and pass its gradients."
        )
    if isinstance(grads, nn.Cell):
        raise TypeError(
            f"'{argument}' must be a tuple or list of gradients, one per parameter of the optimizer, but "
            f"got a Cell (an optimizer?). PyTorch's unscale_(optimizer) and step(optimizer) find the "
            f"gradients on the optimizer; MindSpore gradients are values: differentiate the scaled loss "
            f"with mindspore.value_and_grad and pass them, e.g. grads = scaler.unscale_(grads), then "
            f"scaler.step(optimizer, grads)."
        )
    if not isinstance(grads, (tuple, list)):
        raise TypeError(
            f"'{argument}' must be a tuple or list of gradients, one per parameter of the optimizer (what "
            f"mindspore.value_and_grad returns for them)."
        )
    if not grads and not allow_empty:
        raise ValueError(
            f"'{argument}' holds no gradients: give one per parameter of the optimizer (what "
            f"mindspore.value_and_grad returns for optimizer.parameters)."
        )
    return True


def _is_eager_row_tensor(grad):
    """Whether ``grad`` is a sparse gradient as ``mindspore.value_and_grad`` returns it outside a graph: the tuple
    ``(indices, values, dense_shape)`` of a RowTensor."""
    if not isinstance(grad, tuple) or len(grad) != 3:
        return False
    indices, values, dense_shape = grad
    return isinstance(indices, Tensor) and isinstance(values, Tensor) and isinstance(dense_shape, tuple)


def refuse_non_tensor_entries(grads, argument):
    """TypeError, at trace time inside a graph, for an entry of ``grads`` that cannot be a gradient: a number or a
    NumPy value (MindSpore's own error says only "For 'MultitypeFuncGraph', the input can not be
    numpy.ndarray"), or a tuple/list: gradients nested one level too deep, as ``mindspore.value_and_grad`` with
    ``grad_position`` and ``weights`` returns them (MindSpore's error names a ``NotEqual`` call), or a sparse
    gradient as MindSpore returns it outside a graph (the tuple of a RowTensor). Tensors and ``None`` are left to
    the caller.

    Example:
        >>> refuse_non_tensor_entries((Tensor(np.float32(1.0)), None), "grads")
        True
    """
    for index, grad in enumerate(grads):
        if isinstance(grad, (bool, int, float, np.ndarray, np.generic)):
            raise TypeError(
                f"'{argument}[{index}]' must be a gradient Tensor, but got {type(grad).__name__}: "
                f"gradients are MindSpore Tensors (convert NumPy values with mindspore.Tensor)."
            )
        if _is_eager_row_tensor(grad):
            raise TypeError(
                f"'{argument}[{index}]' is a sparse gradient (RowTensor: indices, values, dense shape), "
                f"as nn.EmbeddingLookup(sparse=True) gives: the GradScaler and the LossScaleOptimizer "
                f"take dense gradients only. Use nn.Embedding, whose gradients are dense."
            )
        if isinstance(grad, (tuple, list)):
            raise TypeError(
                f"'{argument}[{index}]' must be a gradient Tensor, but got a {type(grad).__name__}: give "
                f"the weights' gradients as one flat tuple (mindspore.value_and_grad with grad_position "
                f"and weights returns (inputs' gradients, weights' gradients): pass the second)."
            )
    return True


_sparse_entry = ops.MultitypeFuncGraph("_sparse_entry")


@constexpr
def _refuse_sparse_entry(argument, index):
    raise TypeError(
        f"'{argument}[{index}]' is a sparse gradient (RowTensor), as nn.EmbeddingLookup(sparse=True) gives: the "
        f"GradScaler and the LossScaleOptimizer take dense gradients only. Use nn.Embedding, whose gradients are dense."
    )


@_sparse_entry.register("String", "Number", "RowTensor")
def _row_tensor_entry(argument, index, grad):
    return _refuse_sparse_entry(argument, index)


@_sparse_entry.register("String", "Number", "Tensor")
@_sparse_entry.register("String", "Number", "None")
def _dense_entry(argument, index, grad):
    return True


@constexpr
def _refuse_undetermined(types, argument):
    """TypeError if the gradients' tuple type (``F.typeof``) is still undetermined while compiling: MindSpore
    leaves the gradients of ``value_and_grad`` so when one of them is sparse, and no entry can be named yet."""
    if "Undetermined" in str(types):
        raise TypeError(
            f"'{argument}' holds a sparse gradient (RowTensor), as nn.EmbeddingLookup(sparse=True) gives (MindSpore "
            f"leaves their types undetermined while compiling, {types}): the GradScaler and the LossScaleOptimizer "
            f"take dense gradients only. Use nn.Embedding, whose gradients are dense."
        )
    return True


def refuse_undetermined_gradients(grads, argument):
    """Graph: the part of :func:`refuse_sparse_gradients` that looks at the tuple's type only (no entry is touched)."""
    return _refuse_undetermined(F.typeof(grads), argument)


def refuse_sparse_gradients(grads, argument):
    """TypeError while a compiled function is traced for a sparse gradient (a RowTensor) among ``grads``, naming the
    entry once its type is known; from Python MindSpore gives them as tuples, which :func:`refuse_non_tensor_entries`
    names. (MindSpore's own errors for them name an ``AddN`` call or a Parameter's dtype conversion.)

    Example:
        >>> refuse_sparse_gradients((Tensor(np.float32(1.0)), None), "grads")
        True
    """
    refuse_undetermined_gradients(grads, argument)
    for index in range(len(grads)):
        _sparse_entry(argument, index, grads[index])
    return True
