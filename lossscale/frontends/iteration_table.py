"""The iteration table of :class:`lossscale.frontends.optimizer_states.OptimizerStates`: its layout, the structure
signatures that key its slots, the misuse errors, and what Python reads and writes of it between graph calls.

The table is one float32 Parameter of shape ``(ROWS, capacity)``: a row per field (``STAGE``, ``FOUND_INF``,
``FINGERPRINT``, ``STRUCTURE``, ``NORM``), a column per optimizer slot. A slot's stage moves
``READY -> UNSCALED -> STEPPED`` and back to ``READY`` at ``update()``. ``step()``'s refusals are codes
(``STEP_TWICE``, ...) computed in the graph and turned into errors by :func:`raise_step_misuse`.

Example:
    >>> shapes = ((2, 3), (3,))
    >>> _is_subsequence(((3,),), shapes), _is_subsequence(((4,),), shapes)
    (True, False)
    >>> row_mask(STAGE, NORM).asnumpy().ravel().tolist()
    [True, False, False, False, True]
"""

import zlib

import numpy as np
from mindspore import Tensor, ops
from mindspore.ops import constexpr

from lossscale.core._parameters import outside_graph, write_parameter

READY, UNSCALED, STEPPED = 0, 1, 2
# step() refusal codes (0: none)
STEP_TWICE, SCALED_GRADIENTS, AMBIGUOUS, LARGER_THAN_UNSCALED = 1, 2, 3, 4
# rows of the iteration table
STAGE, FOUND_INF, FINGERPRINT, STRUCTURE, NORM = range(5)
ROWS = NORM + 1
_SHAPES = {}  # structure signature -> the gradients' shapes, for every structure seen (a few per program)

# A gradient's shape: what tells optimizers apart (not its dtype: gradients cast between unscale_() and step(), to
# float32 for clipping, say, are still the ones unscale_() returned).
shape_of = ops.MultitypeFuncGraph("shape_of")


@shape_of.register("Tensor")
def _tensor_shape_of(grad):
    return grad.shape


@shape_of.register("RowTensor")
def _row_tensor_shape_of(grad):
    return grad.dense_shape


@shape_of.register("None")
def _none_shape_of(grad):
    return None


def as_tuples(shapes):
    """``shapes`` (of gradients, None for a missing one) as tuples, comparable and hashable."""
    return tuple(None if shape is None else tuple(shape) for shape in shapes)


@constexpr
def structure_signature(shapes):
    """A deterministic 24-bit int for the shapes of a gradient tuple (exact in float32), remembered with the shapes
    (:func:`related_signatures`). Not their dtypes: gradients cast after unscale_() (to float32 for clipping, say)
    are still the ones unscale_() returned."""
    shapes = as_tuples(shapes)
    signature = zlib.crc32(repr(shapes).encode()) & 0xFFFFFF
    _SHAPES[signature] = shapes
    return signature


def _is_subsequence(part, whole):
    """Whether the sequence ``part`` is ``whole`` with some entries left out (in order)."""
    rest = iter(whole)
    return all(any(entry == other for other in rest) for entry in part)


@constexpr
def related_signatures(signature):
    """The known structure signatures whose gradients could be ``signature``'s, part of them or hold them: the
    same shapes, or a subsequence of them either way (a tuple sliced or filtered per optimizer, or joined)."""
    shapes = _SHAPES[signature]
    return tuple(
        other
        for other, other_shapes in sorted(_SHAPES.items())
        if _is_subsequence(other_shapes, shapes) or _is_subsequence(shapes, other_shapes)
    )


def row_mask(*rows, width=1):
    """A bool Tensor of shape (ROWS, width), True in ``rows`` of the iteration table."""
    mask = np.zeros((ROWS, width), np.bool_)
    mask[list(rows)] = True
    return Tensor(mask)


# ---- the misuse errors, and what Python reads and writes of the table between graph calls ----------------------
def raise_step_misuse(code):
    """Raise the error for a non-zero step() refusal code (called where the step is skipped)."""
    if code == STEP_TWICE:
        raise RuntimeError(
            "step() has already been called since the last update(). Call update() once per "
            "iteration, after every optimizer's step(); with several optimizers give each its "
            "own key."
        )
    if code == SCALED_GRADIENTS:
        raise RuntimeError(
            "step() got the scaled gradients that unscale_() was given for this optimizer. Inside "
            "mindspore.jit unscale_() cannot change gradients in place: pass the gradients it "
            "returned (after any clipping) to step(), e.g. grads = scaler.unscale_(grads)."
        )
    if code == LARGER_THAN_UNSCALED:
        raise RuntimeError(
            "step() got gradients with a larger global norm than the ones unscale_() returned for "
            "this optimizer: the scaled gradients, changed (e.g. clipped) after unscale_() was "
            "given them? Inside mindspore.jit unscale_() cannot change gradients in place: clip "
            "the gradients it returned and pass those to step(), e.g. grads = scaler.unscale_(grads), "
            "then grads = ops.clip_by_global_norm(grads, max_norm) (PyTorch's clip_grad_value_: "
            "grads = tuple(ops.clip_by_value(g, -v, v) for g in grads)). Between unscale_() and step() "
            "only changes that do not raise the norm are accepted: to add to the gradients on "
            "purpose (an L2 term), put it in the loss or in the optimizer's weight_decay."
        )
    if code == AMBIGUOUS:
        raise RuntimeError(
            "step() got gradients shaped like the ones unscale_() returned for another key in "
            "this iteration (the same shapes, or part of them, or holding them), and not yet "
            "stepped, so they may be unscaled already. Give step() the gradients unscale_() "
            "returned for this optimizer, with the same key: to clip several optimizers' "
            "gradients together, unscale_() each optimizer's own gradients, clip them together "
            "and step each optimizer with its part. Otherwise call unscale_() for this "
            "optimizer too, or step the other one first."
        )
    return code


def host_table(table):
    """The table as read on the host (a NumPy copy, one sync); None inside a compiled function, where the graph
    reads it (:func:`lossscale.core._parameters.outside_graph`)."""
    if outside_graph(table):
        return table.asnumpy().copy()
    return None


def refuse_related_unscaled(table, slot, structure):
    """From Python, before step() records anything: the AMBIGUOUS refusal of ``OptimizerStates.ready_code``, with
    the structures known now (a step compiled earlier knows those known when it was compiled)."""
    if table is None or table[STAGE, slot] != READY:
        return
    related = np.isin(table[STRUCTURE], related_signatures(structure))
    others = np.arange(table.shape[1]) != slot
    if np.any((table[STAGE] == UNSCALED) & related & others):
        raise_step_misuse(AMBIGUOUS)


def unscaled_in(table, slot):
    """Whether ``slot``'s stage is UNSCALED in ``table`` (a :func:`host_table` copy); None without one."""
    if table is None:
        return None
    return bool(table[STAGE, slot] == UNSCALED)


def apply_or_restore(parameter, optimizer, grads, table):
    """From Python: ``optimizer(grads)``. If it raises, the table ``parameter`` is written back to ``table`` (as read
    before this step()), so that step() can be called again: PyTorch records a step only once its optimizer
    returned."""
    try:
        return optimizer(grads)
    except BaseException:
        write_parameter(parameter, table)
        raise
