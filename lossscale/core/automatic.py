"""Graphcore's automatic loss scaling (ALS) as a rule: :class:`AutomaticLossScaleRule` (docs/design.md, section 1).

The scale follows where the gradients lie instead of waiting for an overflow. Each step, beside the overflow
check, the rule counts the gradient values that the scale puts in the top of float16's range (``|g| * S`` at or
above ``bin_edge * 65504``); every ``update_period`` steps, if more than ``threshold`` of the values counted since
the last update were there, the scale is divided by ``factor``, else multiplied by it. A step with inf/nan is still
skipped, and divides the scale at once (restarting the period). The names are PopART's ``binEdgeLocation``,
``thresholdUpperCountProportion`` and ``updatePeriod``, with its defaults.

Example:
    >>> rule = AutomaticLossScaleRule(init_scale=1024.0)
    >>> [state["scale"] for state in run(rule, [False, False, True], statistics=[(0, 100), (5, 100), (0, 100)])]
    [2048.0, 1024.0, 512.0]
"""

from dataclasses import dataclass

import numpy as np
from mindspore import ops
from mindspore.common import dtype as mstype

from lossscale.core._validation import FLOAT32_MAX, check_finite_in_range, check_int_in_range
from lossscale.core.gradients import float32_sum, grouped_total, total
from lossscale.core.rule import (
    FLOAT32,
    SCALE,
    LossScaleRule,
    StateField,
    isfinite,
    logical_or,
    maximum,
    minimum,
    run,  # noqa: F401 (the module docstring's example)
    where,
)

FLOAT16_MAX = 65504.0
_F32 = np.float32


@dataclass(frozen=True)
class AutomaticLossScaleRule(LossScaleRule):
    """Automatic loss scaling from the gradients' own range (Graphcore's ALS), with an overflow safety net.

    Per step: ``upper`` and ``values`` add this step's count of gradient values with ``|g| * S >= bin_edge * 65504``
    and of all values (summed over the ranks). At the ``update_period``-th step: the scale is divided by ``factor``
    if ``upper > threshold * values`` (PopART's ``upper > f * lower`` with ``f = t / (1 - t)``), else multiplied by
    it, within ``[min_scale, max_scale]`` and never to inf; the counts restart. An overflow divides the scale at once
    and restarts the counts.

    Args:
        init_scale (float): the first scale, in ``[min_scale, max_scale]``. Default 2**16.
        bin_edge (float): the upper bin's edge as a fraction of float16's largest value, in (0, 1]. Default 1/16
            (values at or above 4094). PopART's ``binEdgeLocation``.
        threshold (float): the fraction of values in the upper bin above which the scale goes down, in [0, 1).
            Default 1e-7. PopART's ``thresholdUpperCountProportion``.
        update_period (int): steps between two updates, >= 1. Default 1. PopART's ``updatePeriod``.
        factor (float): the multiplier up and the divisor down, > 1. Default 2 (PopART's).
        min_scale (float): the floor, > 0. Default 1.
        max_scale (float): the ceiling, finite. Default 2**24: with gradients far below the edge (zero, say) the
            scale grows every period, and an unbounded scale would take as many overflows to come back.

    Example:
        >>> AutomaticLossScaleRule().settings()["edge"], AutomaticLossScaleRule(threshold=0.5).settings()["ratio"]
        (4094.0, 1.0)
    """

    init_scale: float = 2.0**16
    bin_edge: float = 0.0625
    threshold: float = 1e-7
    update_period: int = 1
    factor: float = 2.0
    min_scale: float = 1.0
    max_scale: float = 2.0**24

    fields = (StateField("period_steps"), StateField("upper", FLOAT32), StateField("values", FLOAT32))
    statistics = ("upper", "values")

    def __post_init__(self):
        def checked(name, value):
            object.__setattr__(self, name, value)

        checked("bin_edge", check_finite_in_range("bin_edge", self.bin_edge, low=0.0, high=1.0, low_inclusive=False))
        threshold = check_finite_in_range("threshold", self.threshold, low=0.0, high=1.0, high_inclusive=False)
        checked("threshold", threshold)
        checked("update_period", check_int_in_range("update_period", self.update_period, low=1))
        checked("factor", check_finite_in_range("factor", self.factor, low=1.0, low_inclusive=False))
        checked("min_scale", check_finite_in_range("min_scale", self.min_scale, low=0.0, low_inclusive=False))
        checked("max_scale", check_finite_in_range("max_scale", self.max_scale, low=self.min_scale, high=FLOAT32_MAX))
        low, high = self.scale_bounds()
        checked("init_scale", check_finite_in_range("init_scale", self.init_scale, low=low, high=high))

    def settings(self):
        return dict(
            edge=float(_F32(self.bin_edge * FLOAT16_MAX)),
            ratio=float(_F32(self.threshold / (1.0 - self.threshold))),
            period=self.update_period,
            factor=self.factor,
            min_scale=float(_F32(self.min_scale)),
            max_scale=float(_F32(self.max_scale)),
        )

    def scale_bounds(self):
        return float(_F32(self.min_scale)), float(_F32(self.max_scale))

    def measure(self, hyper_map, grads, scale, edge, *settings):
        """``(values with |g| * scale >= edge, all values)`` of the gradients ``grads``, float32 counts. The small
        gradients are counted in the overflow check's float32 buffers (:func:`lossscale.core.gradients.grouped_total`),
        each large one alone: a compare and a sum per buffer or gradient."""
        bound = edge / scale
        upper = grouped_total(hyper_map, grads, ops.partial(_upper_count, bound), ops.partial(_count_at_least, bound))
        return upper, total(hyper_map(_value_count, grads))

    def update(self, overflow, statistics, scale, steps, upper, values, edge, ratio, period, factor, floor, ceiling):
        steps, upper, values = steps + 1, upper + statistics[0], values + statistics[1]
        lowered = maximum(scale / factor, floor)
        raised = scale * factor
        raised = where(isfinite(raised), minimum(raised, ceiling), scale)
        due = steps >= period
        decided = where(upper > ratio * (values - upper), lowered, raised)
        restart = logical_or(overflow, due)
        return (
            where(overflow, lowered, where(due, decided, scale)),
            where(restart, 0, steps),
            where(restart, 0.0, upper),
            where(restart, 0.0, values),
        )

    def check_state(self, state, names=None):
        names = names or {field.name: f"state_dict[{field.key!r}]" for field in (SCALE, *self.fields)}
        super().check_state(state, names)
        check_int_in_range(names["period_steps"], state["period_steps"], low=0, high=self.update_period - 1)
        check_finite_in_range(names["values"], state["values"], low=0.0)
        check_finite_in_range(names["upper"], state["upper"], low=0.0, high=state["values"])
        return state


def _count_at_least(bound, values):
    """The number of ``values`` (a float32 buffer, or a gradient) with ``|v| >= bound``, as a float32 scalar (exact
    below 2**24: sums of zeros and ones)."""
    return float32_sum(ops.cast(ops.abs(values) >= bound, mstype.float32))


_upper_count = ops.MultitypeFuncGraph("_upper_count")


@_upper_count.register("Tensor", "Tensor")
def _tensor_upper_count(bound, grad):
    if grad.size == 0:
        return ops.zeros((), mstype.float32)
    return _count_at_least(bound, ops.cast(grad, mstype.float32))


@_upper_count.register("Tensor", "RowTensor")
def _row_tensor_upper_count(bound, grad):
    return _count_at_least(bound, ops.cast(grad.values, mstype.float32))


@_upper_count.register("Tensor", "None")
def _none_upper_count(bound, grad):
    return ops.zeros((), mstype.float32)


_value_count = ops.MultitypeFuncGraph("_value_count")


@_value_count.register("Tensor")
def _tensor_value_count(grad):
    return ops.scalar_to_tensor(grad.size, mstype.float32)


@_value_count.register("RowTensor")
def _row_tensor_value_count(grad):
    return ops.scalar_to_tensor(grad.values.size, mstype.float32)


@_value_count.register("None")
def _none_value_count(grad):
    return ops.zeros((), mstype.float32)
