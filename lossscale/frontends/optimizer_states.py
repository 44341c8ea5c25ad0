"""PyTorch's per-optimizer state machine for :class:`lossscale.GradScaler`, kept in Parameters (docs/design.md, 6).

Per optimizer slot, between two ``update()`` calls::

    READY --unscale_()--> UNSCALED --step()--> STEPPED        (step() from READY unscales itself)
    unscale_() in UNSCALED or STEPPED, step() in STEPPED: RuntimeError, with PyTorch's messages

Each slot's stage, overflow flag, fingerprint, structure and norm live in one float32 table Parameter shared by
eager calls and every compiled function; a slot is chosen at trace time by ``key`` or by the gradients' shapes.

Example:
    >>> states = OptimizerStates("doc_states", capacity=4)
    >>> states.slot(None, 1234), states.slot(0, None), states.slot(None, 1234), states.slot("disc", None)
    (0, 1, 0, 2)
"""

import itertools
import weakref

import numpy as np
from mindspore import Parameter, Tensor, nn, ops
from mindspore.common import dtype as mstype
from mindspore.ops import constexpr

from lossscale.core._naming import check_name
from lossscale.core._parameters import outside_graph
from lossscale.core._validation import check_int_in_range
from lossscale.frontends.iteration_table import (
    AMBIGUOUS,
    FINGERPRINT,
    FOUND_INF,
    LARGER_THAN_UNSCALED,
    NORM,
    READY,
    ROWS,
    SCALED_GRADIENTS,
    STAGE,
    STEP_TWICE,
    STEPPED,
    STRUCTURE,
    UNSCALED,
    as_tuples,
    related_signatures,
    row_mask,
    shape_of,
    structure_signature,
)

# step() after unscale_() refuses gradients whose global norm exceeds the unscaled ones' by more than this factor:
# the slack covers rounding in float16 clipping (2**-11 per value), far below the factor S of scaled gradients.
NORM_SLACK = 1.01
DEFAULT_CAPACITY = 16
_REGISTRIES = {}  # OptimizerStates.registry -> {key: slot}, one per living instance
_INSTANCES = itertools.count()
# Primitives rather than Tensor methods (.any(), .max()): fewer graphs for MindSpore to compile.
_reduce_any, _reduce_all, _reduce_max = ops.ReduceAny(), ops.ReduceAll(), ops.ReduceMax()


def _refuse_misfit(shapes, parameter_shapes):
    """ValueError unless the gradients' shapes are the optimizer's parameters' shapes, one for one."""
    shapes, expected = as_tuples(shapes), as_tuples(parameter_shapes)
    if shapes != expected:
        raise ValueError(
            f"'grads' must hold one gradient per parameter of the optimizer, in the order of "
            f"optimizer.parameters (differentiate with respect to optimizer.parameters): the gradients "
            f"have shapes {list(shapes)}, the optimizer's parameters {list(expected)}."
        )
    return True


@constexpr
def _slot(registry, key, signature, capacity):
    """The slot of ``key`` (or of ``signature`` when key is None), assigned on first use."""
    slots = _REGISTRIES.setdefault(registry, {})
    token = ("structure", signature) if key is None else ("key", key)
    if token not in slots:
        if len(slots) >= capacity:
            raise ValueError(
                f"more than {capacity} optimizer keys in one GradScaler: {sorted(map(str, slots))}. "
                f"Use at most {capacity} distinct keys (or gradient structures)."
            )
        slots[token] = len(slots)
    return slots[token]


@constexpr
def _check_key(key):
    if key is not None and (isinstance(key, bool) or not isinstance(key, (int, str))):
        raise TypeError(
            f"'key' must be an int or a str constant (or None), but got {key!r} of type {type(key).__name__}."
        )
    return True


class OptimizerStates(nn.Cell):
    """The per-optimizer stages and overflow flags of one scaler (see the module docstring).

    Args:
        name (str): Parameter name prefix (unique per scaler).
        capacity (int): the most optimizer slots (keys) one scaler serves, >= 1.
    """

    def __init__(self, name, capacity=DEFAULT_CAPACITY):
        super().__init__(auto_prefix=False)
        check_name(name)
        capacity = check_int_in_range("capacity", capacity, low=1)
        # Per instance, not per name: a later scaler that reuses a freed name starts with no keys.
        self.registry = f"{name}#{next(_INSTANCES)}"
        _REGISTRIES[self.registry] = {}
        weakref.finalize(self, _REGISTRIES.pop, self.registry, None)
        self.capacity = capacity
        self.hyper_map = ops.HyperMap()
        self.table = Parameter(
            Tensor(np.zeros((ROWS, capacity), np.float32)), name=f"{name}.iteration", requires_grad=False
        )
        # Tensor constants rather than Python numbers in graph arithmetic (see lossscale.core.overflow).
        self._ready, self._unscaled, self._stepped = (
            Tensor(float(v), mstype.float32) for v in (READY, UNSCALED, STEPPED)
        )
        self._no_misuse, self._step_twice, self._scaled_gradients, self._ambiguous, self._larger = (
            Tensor(v, mstype.int32) for v in (0, STEP_TWICE, SCALED_GRADIENTS, AMBIGUOUS, LARGER_THAN_UNSCALED)
        )
        self._norm_slack = Tensor(NORM_SLACK, mstype.float32)
        self._zero, self._one = Tensor(0.0, mstype.float32), Tensor(1.0, mstype.float32)
        # Per-slot constants as tuples of Tensors: a constant index into a tuple costs nothing to compile,
        # while indexing a Tensor inside a graph compiles MindSpore's whole getitem machinery each time.
        eye = np.eye(capacity, dtype=np.bool_)
        self._slot_indices = tuple(Tensor([i], mstype.int32) for i in range(capacity))
        self._slot_columns = tuple(Tensor(eye[i][None, :]) for i in range(capacity))  # (1, capacity) masks
        self._others = tuple(Tensor(~eye[i]) for i in range(capacity))  # every slot but that one
        self._false_row = Tensor(np.zeros(capacity, np.bool_))
        self._step_rows = row_mask(STAGE, FOUND_INF)
        self._unscale_rows = row_mask(STAGE, FOUND_INF, FINGERPRINT, STRUCTURE, NORM)
        # STRUCTURE is kept across iterations (refusals compare structures within one only).
        self._iteration_rows = row_mask(STAGE, FOUND_INF, FINGERPRINT, NORM, width=capacity)

    # ---- trace time ----------------------------------------------------------------------------
    def structure_of(self, grads):
        """The structure signature of ``grads`` (a constant)."""
        return structure_signature(self.hyper_map(shape_of, grads))

    def refuse_misfit(self, grads, parameters):
        """From Python, ValueError (before anything is recorded or applied) unless ``grads`` has the shapes of
        ``parameters`` (an optimizer's), one for one: gradients of other parameters, or in another order, would
        otherwise fail inside the optimizer after the step was recorded (gradients of equal shapes in another
        order cannot be told apart). Inside a compiled function nothing is checked here: MindSpore's shape
        inference refuses such gradients while compiling, before anything runs, and the check would only add
        compile time. Eager or compiled: :func:`lossscale.core._parameters.outside_graph`."""
        if outside_graph(parameters[0]):
            return _refuse_misfit(self.hyper_map(shape_of, grads), tuple(parameter.shape for parameter in parameters))
        return True

    def slot(self, key, signature):
        """The slot index for ``key`` (int/str) or, with ``key=None``, for the structure ``signature``."""
        _check_key(key)
        return _slot(self.registry, key, signature, self.capacity)

    # ---- graph: reads ----------------------------------------------------------------------------
    def column(self, slot):
        """The slot's fields as a tuple of scalars, indexed by the row constants (``column[STAGE]``, ...).

        A gather, not ``table[:, slot]``: MindSpore 2.10's graph compiler merges two such slices of one
        Parameter even when the Parameter is written between them, so a read after a write returned the
        value from before it (measured). Tensor indexing is also slow to compile (see ``__init__``)."""
        return ops.unstack(ops.gather(self.table, self._slot_indices[slot], 1).reshape((ROWS,)))

    def _rows(self):
        """The table's rows, indexed by the row constants (``rows[STAGE]``, ...)."""
        return ops.unstack(self.table)

    def unscaled(self, column):
        """Whether the slot's stage is UNSCALED."""
        return column[STAGE] == self._unscaled

    def found_after_unscale(self, column, overflow):
        """step() after unscale_(): what unscale_() found, or ``overflow`` (a bool: the given gradients now
        being non-finite on some rank), as float32 0/1."""
        return ops.maximum(column[FOUND_INF], ops.cast(overflow, mstype.float32))

    def any_found(self):
        """float32, non-zero if any optimizer's gradients overflowed since the last update() on this rank."""
        return _reduce_max(self._rows()[FOUND_INF])

    # ---- graph: refusals (nothing has changed when they raise) ---------------------------------
    def refuse_unscale(self, stage):
        """Raise unless ``stage`` (the slot's stage before this unscale_()) is READY."""
        if stage != self._ready:
            if stage == self._unscaled:
                raise RuntimeError(
                    "unscale_() has already been called on this optimizer since the last update(). "
                    "Call it once per optimizer per iteration and pass the gradients it returned to "
                    "step(); with several optimizers give each its own key."
                )
            raise RuntimeError(
                "unscale_() is being called after step(). Call unscale_() before step() (step() "
                "has already unscaled and applied these gradients), or update() first."
            )
        return stage

    def scaled_gradients_code(self, column, fingerprint, norm, scale):
        """step() after unscale_(), while the scale is not 1 (else both kinds of gradients are the same):
        SCALED_GRADIENTS if ``fingerprint`` is that of the scaled gradients unscale_() was given;
        LARGER_THAN_UNSCALED if their global ``norm`` exceeds that of the gradients unscale_() returned by more
        than NORM_SLACK; else 0.

        What may happen between unscale_() and step() in PyTorch's recipes (clipping by global norm, by
        norm or by value, masking, averaging) never raises the norm. Scaled gradients that were clipped
        (the return value of unscale_() dropped, then the usual clipping) are S times larger until clipped:
        at the clip norm, above the true norm whenever that is below it, and the fingerprint no longer
        matches them. Only finite records count: gradients holding an inf unscale to gradients holding the
        same inf, and unscale_() recorded that overflow, so the step is skipped anyway; given gradients
        with an inf are skipped too."""
        seen, unscaled_norm = column[FINGERPRINT], column[NORM]
        scale_matters = scale != self._one
        recognisable = ops.logical_and(ops.isfinite(seen), ops.logical_and(seen != self._zero, scale_matters))
        scaled = ops.logical_and(fingerprint == seen, recognisable)
        comparable = ops.logical_and(ops.logical_and(ops.isfinite(unscaled_norm), ops.isfinite(norm)), scale_matters)
        larger = ops.logical_and(norm > unscaled_norm * self._norm_slack, comparable)
        code = ops.select(larger, self._larger, self._no_misuse)
        return ops.select(scaled, self._scaled_gradients, code)

    def ready_code(self, slot, column, structure):
        """step() without unscale_(): STEP_TWICE if the slot already stepped; AMBIGUOUS if another slot holds
        unscaled gradients, not yet stepped, of this ``structure`` or a related one (:func:`related_signatures`:
        these gradients may be those, part of them, or hold them, so they may be unscaled already); else 0."""
        rows = self._rows()
        related = self._false_row
        for signature in related_signatures(structure):
            related = ops.logical_or(related, rows[STRUCTURE] == signature)
        others = ops.logical_and(rows[STAGE] == self._unscaled, related)
        ambiguous = _reduce_any(ops.logical_and(others, self._others[slot]))
        code = ops.select(ambiguous, self._ambiguous, self._no_misuse)
        return ops.select(column[STAGE] == self._stepped, self._step_twice, code)

    def refuse_update_without_checks(self):
        """PyTorch: update() needs an unscale_() or step() since the last update()."""
        if _reduce_all(self._rows()[STAGE] == self._ready):
            raise AssertionError(
                "No inf checks were recorded prior to update(): call step() (or unscale_()) for "
                "each optimizer before update()."
            )
        return self.table

    # ---- graph: records (one whole-table write each) ---------------------------------------------
    @staticmethod
    def _written(table, where, values):
        """``table`` with ``values`` (broadcast to it) where ``where`` is True."""
        return ops.select(where, ops.broadcast_to(values, table.shape), table)

    def _write(self, where, values):
        """``table[where] = values`` (``values`` broadcast to the table); returns the assign."""
        return ops.assign(self.table, self._written(self.table, where, values))

    def record_unscale(self, slot, column, found, fingerprint, structure, norm):
        """Record an unscale_() if the slot's ``column`` (read before) is READY; else nothing changes (refused)."""
        values = ops.stack((self._unscaled, found, fingerprint, ops.cast(structure, mstype.float32), norm)).reshape(
            (ROWS, 1)
        )
        where = ops.logical_and(self._unscale_rows, self._slot_columns[slot])
        return self._write(ops.logical_and(where, column[STAGE] == self._ready), values)

    def record_step(self, slot, found, code):
        """Record this step's decision unless it is refused (``code`` != 0: nothing changes); return
        whether the optimizer is skipped (an overflow, or a refusal)."""
        refused = code != self._no_misuse
        values = ops.stack((self._stepped, found, self._zero, self._zero, self._zero)).reshape((ROWS, 1))
        where = ops.logical_and(ops.logical_and(self._step_rows, self._slot_columns[slot]), ops.logical_not(refused))
        done = self._write(where, values)
        return ops.depend(ops.logical_or(refused, found > self._zero), done)

    def between_iterations(self):
        """True when no unscale_() or step() happened since the last update() (one host sync)."""
        return not self.table.asnumpy()[STAGE].any()

    def reset(self):
        """A new iteration: every slot READY, no overflow recorded."""
        return self._write(self._iteration_rows, self._zero)
