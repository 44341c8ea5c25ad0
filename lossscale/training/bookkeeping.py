"""What the train cell records about overflows: counters, forensics, and the persistent-overflow policy.

- :class:`OverflowCounters` (graph): saturating int32 Parameters ``loss_scale_steps``,
  ``loss_scale_skipped_steps``, ``loss_scale_consecutive_overflows`` and
  ``loss_scale_last_overflow_step``, updated in the train graph, read with one sync.
- :class:`OverflowForensics` (graph + host, only with ``debug_overflow=True``): which
  parameters' raw gradients and whether the loss were non-finite on an overflowing step.
- :class:`PersistentOverflowPolicy` (host, only with ``overflow_policy`` warn/raise): after
  each call, warn once or raise :class:`PersistentOverflowError` when overflows persist.

Example:
    >>> counters = OverflowCounters()
    >>> counters.as_dict()
    {'steps': 0, 'skipped_steps': 0, 'consecutive_overflows': 0, 'last_overflow_step': 0}
"""

import logging

import numpy as np
from mindspore import Parameter, Tensor, nn, ops
from mindspore.common import dtype as mstype

from lossscale.core._text import plural
from lossscale.core._validation import INT32_MAX, check_bool, check_int_in_range
from lossscale.core._warnings import warn_at_caller
from lossscale.core.gradients import nonfinite_per_tensor, zero_or_nan
from lossscale.training.accumulation import counter

OVERFLOW_POLICIES = ("skip", "warn", "raise")
LOGGER = logging.getLogger("lossscale")


class PersistentOverflowError(RuntimeError):
    """Raised by ``overflow_policy="raise"`` when overflows persist (see the train cell), and by
    :meth:`lossscale.DynamicLossScaleManager.update_loss_scale` after more than ``bad_step_max`` overflows in a
    row (MindSpore's manager raises a ``RuntimeError`` there).

    The train cell's message gives the step, the reason (consecutive count or minimum scale), the
    scale, the skipped-step count and what to try.

    Example:
        >>> issubclass(PersistentOverflowError, RuntimeError)
        True
    """


class OverflowCounters(nn.Cell):
    """Saturating int32 counters of optimizer steps (windows) and overflows, kept on the device."""

    def __init__(self):
        super().__init__(auto_prefix=False)
        self.steps = counter("loss_scale_steps")
        self.skipped_steps = counter("loss_scale_skipped_steps")
        self.consecutive_overflows = counter("loss_scale_consecutive_overflows")
        self.last_overflow_step = counter("loss_scale_last_overflow_step")
        self._max = Tensor(INT32_MAX, mstype.int32)
        self._one = Tensor(1, mstype.int32)

    def count(self, overflow, drops_overflow):
        """One optimizer step with this ``overflow``; an overflow is a skipped step if ``drops_overflow``."""
        one = self._one
        steps = ops.select(self.steps < self._max, self.steps + one, self.steps)
        skipped_steps = self.skipped_steps
        if drops_overflow:
            skip = ops.logical_and(overflow, self.skipped_steps < self._max)
            skipped_steps = ops.select(skip, self.skipped_steps + one, self.skipped_steps)
        consecutive = ops.select(
            overflow,
            ops.minimum(self.consecutive_overflows, self._max - one) + one,
            ops.zeros_like(self.consecutive_overflows),
        )
        last = ops.select(overflow, steps, self.last_overflow_step)
        done = ops.assign(self.steps, steps)
        done = ops.depend(done, ops.assign(self.skipped_steps, skipped_steps))
        done = ops.depend(done, ops.assign(self.consecutive_overflows, consecutive))
        return ops.depend(done, ops.assign(self.last_overflow_step, last))

    def as_dict(self):
        """The counters as Python ints (one host sync)."""
        return {
            "steps": int(self.steps.asnumpy()),
            "skipped_steps": int(self.skipped_steps.asnumpy()),
            "consecutive_overflows": int(self.consecutive_overflows.asnumpy()),
            "last_overflow_step": int(self.last_overflow_step.asnumpy()),
        }


class OverflowForensics(nn.Cell):
    """Per step: which raw gradients and whether the loss were non-finite (ORed over a window)."""

    def __init__(self, weights):
        super().__init__(auto_prefix=False)
        self.parameter_names = [p.name for p in weights]
        self.hyper_map = ops.HyperMap()
        self.nonfinite_grads = Parameter(
            Tensor(np.zeros(len(weights), np.bool_)), name="loss_scale_nonfinite_grads", requires_grad=False
        )
        self.nonfinite_loss = counter("loss_scale_nonfinite_loss", False, mstype.bool_)
        self.reports = []

    def record(self, grads, loss, keep):
        """Store this (micro-)step's flags; ``keep``: OR them with the stored ones (inside a window)."""
        per_tensor = ops.stack(nonfinite_per_tensor(self.hyper_map, grads))
        loss_bad = ops.logical_not(ops.isfinite(zero_or_nan(loss)))  # float32: bfloat16 losses too
        per_tensor = ops.logical_or(ops.logical_and(self.nonfinite_grads, keep), per_tensor)
        loss_bad = ops.logical_or(ops.logical_and(self.nonfinite_loss, keep), loss_bad)
        done = ops.assign(self.nonfinite_grads, per_tensor)
        return ops.depend(done, ops.assign(self.nonfinite_loss, loss_bad))

    def report(self, step):
        """Host: append and log ``{"step", "loss_nonfinite", "parameters"}`` for an overflowing step."""
        flags = self.nonfinite_grads.asnumpy()
        entry = {
            "step": step,
            "loss_nonfinite": bool(self.nonfinite_loss.asnumpy()),
            "parameters": [name for name, bad in zip(self.parameter_names, flags) if bad],
        }
        self.reports.append(entry)
        LOGGER.warning(
            "overflow at step %d: loss non-finite: %s; non-finite gradients: %s",
            entry["step"],
            entry["loss_nonfinite"],
            ", ".join(entry["parameters"]) or "none",
        )


# What the persistent-overflow message advises (the command line gives its own options instead).
PERSISTENT_OVERFLOW_ADVICE = (
    "Try: debug_overflow=True to name the parameters with non-finite gradients, check the "
    "inputs for inf/nan, lower the learning rate, clip gradients (clip_global_norm), keep "
    "the unstable layers in float32, or lower min_loss_scale."
)


class PersistentOverflowPolicy:
    """Host-side reaction to persistent overflow: ``"skip"`` (nothing), ``"warn"`` (once) or ``"raise"``.

    Triggered after ``max_consecutive_overflows`` consecutive overflowing steps, or by an
    overflow while a dynamic scale is already at its minimum.
    """

    def __init__(self, policy, max_consecutive_overflows):
        if policy not in OVERFLOW_POLICIES:
            raise ValueError(f"'overflow_policy' must be one of {OVERFLOW_POLICIES}, but got {policy!r}.")
        if max_consecutive_overflows is not None:
            check_int_in_range("max_consecutive_overflows", max_consecutive_overflows, low=1)
            if policy == "skip":
                raise ValueError(
                    "'max_consecutive_overflows' needs overflow_policy='warn' or 'raise', "
                    "but got overflow_policy='skip'."
                )
        self.policy = policy
        self.max_consecutive_overflows = max_consecutive_overflows
        self._warned = False

    @property
    def active(self):
        """Whether the train cell must check after each call (one host sync)."""
        return self.policy != "skip"

    def check(self, counters, scale, minimum):
        """Warn or raise if this overflowing step makes the overflow persistent."""
        at_minimum = minimum is not None and scale <= np.float32(minimum)
        too_many = (
            self.max_consecutive_overflows is not None
            and counters["consecutive_overflows"] >= self.max_consecutive_overflows
        )
        if not (at_minimum or too_many):
            return
        reason = (
            f"the loss scale is already at its minimum {minimum:g}"
            if at_minimum
            else f"{counters['consecutive_overflows']} consecutive overflowing steps "
            f"(max_consecutive_overflows={self.max_consecutive_overflows})"
        )
        message = (
            f"Persistent overflow at step {counters['steps']}: {reason}; loss scale {scale:g}, "
            f"{plural(counters['skipped_steps'], 'step')} skipped so far. Every overflowing step is skipped, "
            f"so training is not progressing. {PERSISTENT_OVERFLOW_ADVICE}"
        )
        if self.policy == "raise":
            raise PersistentOverflowError(message)
        if not self._warned:
            self._warned = True
            warn_at_caller(message, RuntimeWarning)


def check_debug_flag(debug_overflow):
    """``debug_overflow`` validated (a bool)."""
    return check_bool("debug_overflow", debug_overflow)
