"""The ``GradScaler``'s work inside graphs: the calls' graph part and the refusals before anything is applied.

:class:`IterationGraph` is what ``unscale_``, ``step`` and ``update`` run (inline inside ``mindspore.jit``, or
compiled once per method when called from Python: :mod:`lossscale.frontends._eager_calls`), over the
per-optimizer state machine of :mod:`lossscale.frontends.optimizer_states`. The constexpr refusals raise
while a compiled function is traced, or at the call from Python.
"""

import mindspore as ms
import numpy as np
from mindspore import Tensor, ops
from mindspore.common import dtype as mstype
from mindspore.ops import constexpr

from lossscale.core import gradients
from lossscale.core._validation import check_finite_in_range
from lossscale.core.clipping import global_norm
from lossscale.core.scaler import apply_rule, positive_scale
from lossscale.frontends.iteration_table import READY, STAGE


@constexpr
def refuse_loss_scale_optimizer():
    raise TypeError(
        "'optimizer' is a LossScaleOptimizer, which scales the loss and unscales the gradients itself: "
        "give the GradScaler its inner_optimizer, or train with the LossScaleOptimizer alone."
    )


@constexpr
def refuse_optimizer_loss_scale(loss_scale):
    if float(loss_scale) != 1.0:
        raise ValueError(
            f"'optimizer.loss_scale' is {float(loss_scale)!r}: the optimizer would divide the gradients "
            f"the scaler already unscaled a second time. Build it without 'loss_scale'."
        )
    return True


@constexpr
def refuse_optimizer_without_parameters():
    raise TypeError(
        "'optimizer' must hold its Parameters in 'parameters', as mindspore.nn.Optimizer and the "
        "mindspore.experimental.optim / mint.optim optimizers do (and MindSpore's train cells need): step() "
        "checks the gradients against them. Give your optimizer Cell a 'parameters' tuple."
    )


@constexpr
def checked_new_scale(value, low, high):
    """update(new_scale) with a number (or, called from Python, a Tensor): finite, > 0 with a finite reciprocal,
    and within the rule's bounds ``[low, high]`` (``(0, high]`` when ``low`` is 0); a float32 Tensor."""
    scale = float(positive_scale("new_scale", value))
    check_finite_in_range("new_scale", scale, low=low, high=high, low_inclusive=low > 0)
    return Tensor(scale, mstype.float32)


@constexpr
def refuse_host_call_in_graph(method, from_python):
    """RuntimeError while tracing a compiled function that calls a host method (``from_python`` False)."""
    if not from_python:
        raise RuntimeError(
            f"GradScaler.{method} reads or writes the scaler's state from Python (a host call): call it "
            f"outside mindspore.jit, between iterations. Steps compiled before it see what it "
            f"changes; inside a compiled function read the scale with get_scale()."
        )
    return True


@constexpr
def _refuse_new_scale_shape(shape):
    if int(np.prod(shape)) != 1:
        raise TypeError(f"'new_scale' must be one float value, but got a Tensor of shape {tuple(shape)}.")
    return True


def new_scale_in_graph(value, low, high):
    """update(new_scale) with a Tensor inside a compiled function: its value is known only when the graph runs,
    so the checks of :func:`checked_new_scale` are graph ops (a refusal is a runtime ``raise``)."""
    _refuse_new_scale_shape(ops.shape(value))
    value = ops.cast(value, mstype.float32).reshape(())
    valid = ops.logical_and(ops.isfinite(value), ops.isfinite(ops.reciprocal(value)))
    valid = ops.logical_and(valid, ops.logical_and(value > 0.0, value <= high))
    valid = ops.logical_and(valid, value >= low)
    if ops.logical_not(valid):
        raise ValueError(
            f"'new_scale' must be a finite float32 number in [{low}, {high}] (and > 0) whose reciprocal is finite."
        )
    return value


# From this many gradients (all in buffers) a compiled step() computes both stages rather than branching: a branch
# costs with the gradients it carries, both stages with the buffers' size (measured: docs/performance.md).
BRANCH_FREE_MIN_GRADIENTS = 16


@ms.jit_class
class IterationGraph:
    """The graph part of the GradScaler's calls: unscale and record, decide a step, update from the checks.

    Kept apart from the scaler so that the compiled versions of these methods, which the scaler
    keeps (:mod:`lossscale.frontends._eager_calls`), hold this object and not the scaler: MindSpore keeps
    what a compiled Cell uses alive while the Cell lives, so through the scaler that would be a
    cycle that no garbage collection breaks (measured: the scaler and its name were never freed).

    Args:
        core (LossScaler), states (OptimizerStates), statistics (IterationStatistics): the scaler's.
    """

    def __init__(self, core, states, statistics):
        self._core = core
        self._states = states
        self._statistics = statistics
        self._hyper_map = ops.HyperMap()
        self._one = Tensor(1.0, mstype.float32)
        self._ready = Tensor(float(READY), mstype.float32)
        self._no_refusal = Tensor(0, mstype.int32)

    def unscale_and_record(self, grads, slot, structure):
        """``(grads / S, the slot's stage before)``; records the unscale only if that stage was READY (else
        the caller refuses it and nothing has changed)."""
        column = self._states.column(slot)
        seen = gradients.fingerprint(self._hyper_map, grads)
        unscaled = self._core.unscale(grads)
        recorded = self._states.record_unscale(
            slot, column, self.decide(unscaled), seen, structure, global_norm(self._hyper_map, unscaled)
        )
        if self._statistics.count:
            recorded = ops.depend(recorded, self._measured(unscaled, column[STAGE] == self._ready))
        return ops.depend(unscaled, recorded), ops.depend(column[STAGE], recorded)

    def _measured(self, unscaled, counts):
        """Add the rule's statistics of gradients this call ``unscaled`` to the iteration's, where ``counts`` (for a
        rule that reads statistics: callers test ``self._statistics.count`` first, so others pay no kernel)."""
        return self._statistics.add(self._core.statistics(unscaled), counts)

    def decide(self, unscaled):
        """float32 0/1: these unscaled gradients overflowed on some rank (the core all-reduces the flag in
        parallel modes, so a loss that is non-finite on one rank only skips the step on every rank)."""
        return ops.cast(self._core.is_overflow(self._core.flag(None, unscaled)), mstype.float32)

    def step_decision(self, grads, slot, structure, after_unscale=None):
        """``(the gradients to apply, skipped, refusal code)`` for step(), with the step recorded unless
        refused (code != 0). ``after_unscale``: whether the slot is UNSCALED, when the caller read it on the
        host (a constant: only that path is compiled); None reads it when the graph runs, without a branch where
        every gradient is summed in buffers (:meth:`_either_decision`)."""
        column = self._states.column(slot)
        if after_unscale is None:
            if len(grads) >= BRANCH_FREE_MIN_GRADIENTS and gradients.all_grouped(self._hyper_map, grads):
                return self._either_decision(grads, slot, structure, column)
            after_unscale = self._states.unscaled(column)
        if after_unscale:
            nonfinite, code = self._after_unscale(column, grads)
            found = self._states.found_after_unscale(column, self._core.is_overflow(nonfinite))
            to_apply = grads
        else:
            to_apply = self._core.unscale(grads)
            found = self.decide(to_apply)
            code = self._states.ready_code(slot, column, structure)
            if self._statistics.count:
                code = ops.depend(code, self._measured(to_apply, code == self._no_refusal))
        skipped = self._states.record_step(slot, found, code)
        return to_apply, skipped, code

    def _after_unscale(self, column, grads):
        """step() after unscale_(): ``(float32 1/0: whether grads hold inf/nan, refusal code)``, the code
        SCALED_GRADIENTS or LARGER_THAN_UNSCALED against what unscale_() recorded in ``column``, else 0."""
        seen = gradients.fingerprint(self._hyper_map, grads)
        nonfinite = ops.cast(ops.logical_not(ops.isfinite(seen)), mstype.float32)
        norm = global_norm(self._hyper_map, grads)
        return nonfinite, self._states.scaled_gradients_code(column, seen, norm, self._core.scale_value)

    def _either_decision(self, grads, slot, structure, column):
        """:meth:`step_decision` for both stages at once, selected by the stage read when the graph runs.

        A branch on the stage costs every step, taken or not, with the gradients it carries (docs/design.md,
        section 6). With every gradient in buffers (:func:`lossscale.core.gradients.all_grouped`) the fingerprint
        and norm cost a few kernels, so both stages' answers are computed: the gradients times 1 (after unscale_(),
        exact) or 1/S, then the check, fingerprint and norm of those, the recorded or the new overflow, and either
        stage's refusal code."""
        first = self._states.unscaled(column)
        to_apply = self._core.unscale(grads, ops.select(first, self._one, self._core.scale_value.reshape(())))
        nonfinite, after_code = self._after_unscale(column, to_apply)
        overflow = self._core.is_overflow(ops.select(first, nonfinite, self._core.flag(None, to_apply)))
        found = ops.select(
            first, self._states.found_after_unscale(column, overflow), ops.cast(overflow, mstype.float32)
        )
        code = ops.select(first, after_code, self._states.ready_code(slot, column, structure))
        if self._statistics.count:
            counts = ops.logical_and(ops.logical_not(first), code == self._no_refusal)
            code = ops.depend(code, self._measured(to_apply, counts))
        return to_apply, self._states.record_step(slot, found, code), code

    def update_from_checks(self):
        """Adjust the scale from this iteration's overflows and start the next iteration.

        Not merged with the refusal under an ``if``: MindSpore 2.10 dropped the writes of such a branch from a
        compiled ``update()`` (measured)."""
        overflow = self._core.is_overflow(self._states.any_found())
        apply_rule(self._core, overflow, self._statistics.taken())
        return self._states.reset()

    def restart(self):
        """Start the next iteration without the rule (update(new_scale)): every slot READY, no statistics."""
        return ops.depend(self._states.reset(), self._statistics.taken())
