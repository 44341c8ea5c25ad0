"""``AdaptiveLossScaleUpdateCell``: MindFormers' adaptive-window update cell, :mod:`lossscale.core.adaptive` in graph.

The call contract, argument names and Parameter names are MindFormers' (``cell(loss_scale, overflow)`` writes the
new scale into ``loss_scale`` and returns ``overflow``; ``scale_window``, ``list_index``,
``scale_window_up_count``, ``scale_window_down_count``, ``current_iterator_step``,
``last_overflow_iterator_step``), so the cell drives lossscale's train cell, MindSpore's and MindFormers' own, and
a MindFormers checkpoint's window state loads into it. Every step is branch-free ``select``s, as the rule's
pseudo-code reads.

Example:
    >>> cell = AdaptiveLossScaleUpdateCell(loss_scale_value=2**10, scale_factor=2, scale_window=20)
    >>> cell.get_loss_scale(), cell.state_dict()["scale_window"], cell.rule.levels
    (1024.0, 20, (20, 30, 40, 50, 100, 200, 500, 1000))
"""

import dataclasses

import numpy as np
from mindspore import Parameter, Tensor, ops
from mindspore.common import dtype as mstype

from lossscale.core._naming import check_name
from lossscale.core._parameters import host_array, outside_graph, read_scalar, write_parameter
from lossscale.core._validation import FLOAT32_MAX, check_finite_in_range, check_int_in_range
from lossscale.core.adaptive import (
    HIDDEN,
    MAX_SCALE_WINDOW,
    MIN_SCALE_WINDOW,
    MOVES,
    AdaptiveState,
    AdaptiveWindowRule,
)
from lossscale.core.policy import state_dict_values
from lossscale.core.update_cells import _UpdateCellBase, check_overflow_argument

# The state dict's keys and the Parameters holding them (MindFormers' names), in AdaptiveState's order.
STATE_PARAMETERS = {
    "scale_window": "scale_window",
    "list_index": "list_index",
    "window_up_count": "scale_window_up_count",
    "window_down_count": "scale_window_down_count",
    "cur_iter": "current_iterator_step",
    "last_overflow_iter": "last_overflow_iterator_step",
}
STATE_KEYS = ("loss_scale", *STATE_PARAMETERS)


def adaptive_rule(loss_scale_value, scale_factor, scale_window, max_scale_window, min_scale_window, init_name=None):
    """The :class:`AdaptiveWindowRule`, its errors naming the initial scale ``init_name`` (default MindFormers'
    ``loss_scale_value``)."""
    try:
        return AdaptiveWindowRule(loss_scale_value, scale_factor, scale_window, max_scale_window, min_scale_window)
    except (TypeError, ValueError) as error:
        raise type(error)(str(error).replace("'init_scale'", f"'{init_name or 'loss_scale_value'}'")) from None


def check_adaptive_state(rule, state, owner="state_dict"):
    """``state`` (an :class:`AdaptiveState`) if a cell of ``rule`` can hold it; ``ValueError`` naming the key.

    Example:
        >>> rule = AdaptiveWindowRule(8.0, 2, 20)
        >>> check_adaptive_state(rule, AdaptiveState(8.0, window=40, level=0))
        Traceback (most recent call last):
        ...
        ValueError: 'state_dict['scale_window']' must be the window of level 0, 20, but got 40.
    """
    check_finite_in_range(f"{owner}['loss_scale']", state.scale, low=1.0, high=FLOAT32_MAX)
    check_int_in_range(f"{owner}['list_index']", state.level, low=HIDDEN, high=len(rule.levels) - 1)
    if state.window != rule.window_of(state.level):
        raise ValueError(
            f"'{owner}['scale_window']' must be the window of level {state.level}, {rule.window_of(state.level)}, "
            f"but got {state.window}."
        )
    check_int_in_range(f"{owner}['window_up_count']", state.ups, low=0, high=MOVES)
    check_int_in_range(f"{owner}['window_down_count']", state.downs, low=0, high=MOVES)
    check_int_in_range(f"{owner}['cur_iter']", state.step, low=1)
    check_int_in_range(f"{owner}['last_overflow_iter']", state.last_step, low=0, high=state.step - 1)
    return state


def adaptive_state_dict(state):
    """An :class:`AdaptiveState` as a state dict (:data:`STATE_KEYS`, in the state's field order)."""
    return dict(zip(STATE_KEYS, dataclasses.astuple(state)))


def adaptive_state_from_dict(rule, state_dict, owner="state_dict"):
    """The :class:`AdaptiveState` of a state dict, validated against ``rule``; errors name the key.

    Example:
        >>> rule = AdaptiveWindowRule(8.0, 2, 20)
        >>> adaptive_state_from_dict(rule, adaptive_state_dict(rule.initial_state())) == rule.initial_state()
        True
    """
    values = state_dict_values(state_dict, STATE_KEYS, owner)
    for key in STATE_PARAMETERS:
        if not isinstance(values[key], int):
            raise TypeError(f"'{owner}[{key!r}]' must be an int, but got {values[key]!r}.")
    state = AdaptiveState(float(values["loss_scale"]), *(values[key] for key in STATE_PARAMETERS))
    return check_adaptive_state(rule, state, owner)


class AdaptiveLossScaleUpdateCell(_UpdateCellBase):
    """MindFormers' ``AdaptiveLossScaleUpdateCell``: a dynamic scale whose growth window moves between levels.

    Args:
        loss_scale_value (float): the initial scale, finite and >= 1.
        scale_factor (float): growth and back-off factor, > 1.
        scale_window (int): the starting window: one of the levels, else the lowest (with a warning).
        max_scale_window (int): the top level (default 1000, MindFormers' code; its docstring swaps the defaults).
        min_scale_window (int): the lowest level (default 20); ``0 < min_scale_window < max_scale_window``.

    Inputs: ``loss_scale`` (the scale Parameter, written) and ``overflow`` (a bool Tensor). Output: ``overflow``.
    The rule is :func:`lossscale.core.adaptive.update_adaptive`, except that a scale is never written that is
    not finite.

    Example:
        >>> import mindspore as ms
        >>> cell = AdaptiveLossScaleUpdateCell(loss_scale_value=8.0, scale_factor=2, scale_window=20)
        >>> scale = ms.Parameter(ms.Tensor(np.float32(8.0)), name="doc_scale")
        >>> _ = cell(scale, ms.Tensor(True))          # an overflow: backed off
        >>> float(scale.asnumpy()), cell.state_dict()["window_down_count"]
        (4.0, 1)
    """

    def __init__(
        self,
        loss_scale_value,
        scale_factor,
        scale_window,
        max_scale_window=MAX_SCALE_WINDOW,
        min_scale_window=MIN_SCALE_WINDOW,
    ):
        rule = adaptive_rule(loss_scale_value, scale_factor, scale_window, max_scale_window, min_scale_window)
        super().__init__(loss_scale_value)
        self._rule = rule
        start = rule.initial_state()
        for key, value in zip(STATE_PARAMETERS, dataclasses.astuple(start)[1:]):
            setattr(
                self, f"_{key}", Parameter(Tensor(value, mstype.int32), name=STATE_PARAMETERS[key], requires_grad=False)
            )
        self._levels = Tensor(np.array(rule.levels, np.int32))
        self._top, self._hidden = Tensor(len(rule.levels) - 1, mstype.int32), Tensor(HIDDEN, mstype.int32)
        self._zero, self._one = Tensor(0, mstype.int32), Tensor(1, mstype.int32)
        self._moves, self._wrap = Tensor(MOVES, mstype.int32), Tensor(MOVES + 1, mstype.int32)
        self._factor = Tensor(rule.scale_factor, mstype.float32)
        self._inverse = Tensor(np.float32(1.0) / np.float32(rule.scale_factor), mstype.float32)
        self._floor, self._ceiling = Tensor(1.0, mstype.float32), Tensor(FLOAT32_MAX, mstype.float32)

    dynamic = True

    @classmethod
    def from_rule(cls, rule):
        """The cell of an :class:`AdaptiveWindowRule` (``LossScaler(rule)`` builds it so).

        Example:
            >>> AdaptiveLossScaleUpdateCell.from_rule(AdaptiveWindowRule(8.0, 2, 40)).state_dict()["scale_window"]
            40
        """
        return cls(rule.init_scale, rule.scale_factor, rule.scale_window, rule.max_scale_window, rule.min_scale_window)

    @property
    def rule(self):
        """The :class:`lossscale.core.adaptive.AdaptiveWindowRule` (levels, factor, bounds)."""
        return self._rule

    def rename_parameters(self, prefix):
        """Name the window Parameters ``<prefix>.scale_window``, ... (several cells in one graph)."""
        check_name(prefix, "prefix")
        for key, name in STATE_PARAMETERS.items():
            getattr(self, f"_{key}").name = f"{prefix}.{name}"

    def get_state(self):
        """The :class:`AdaptiveState` the device holds (a host read of each of its seven Parameters)."""
        counters = [int(host_array(getattr(self, f"_{key}")).reshape(-1)[0]) for key in STATE_PARAMETERS]
        return AdaptiveState(self.get_loss_scale(), *counters)

    def rule_value(self, field):
        """The rule seen as a fixed-window one (a GradScaler's getters): ``growth_factor`` (``scale_factor``),
        ``backoff_factor`` (its reciprocal), ``hysteresis`` (1), and ``growth_interval``, the current window:
        eagerly an int (one host sync), inside a compiled function a graph read.

        Example:
            >>> cell = AdaptiveLossScaleUpdateCell(8.0, 2, 30)
            >>> cell.rule_value("growth_interval"), cell.rule_value("backoff_factor")
            (30, 0.5)
        """
        if field == "growth_interval":  # a window of 0 grows at every step, as one of 1 (AdaptiveState)
            if outside_graph(self._scale_window):
                return max(read_scalar(self._scale_window), 1)
            return ops.maximum(self._scale_window, self._one).reshape(())
        return getattr(self._rule, field)

    def read_good_steps(self):
        """Steps since the last growth or overflow (:attr:`AdaptiveState.good_steps`): eagerly an int (host reads),
        inside a compiled function an int32 scalar Tensor read when the graph runs."""
        if outside_graph(self._cur_iter):
            return self.get_state().good_steps
        since = self._cur_iter - self._last_overflow_iter - self._one
        return ops.minimum(since, ops.maximum(self._scale_window, self._one) - self._one).reshape(())

    def check_loaded_state(self, scale=None, scale_name="loss_scale"):
        """``ValueError`` naming the Parameter (``scale_name`` for the scale) unless the window state the device
        holds fits the rule: a checkpoint of a cell with other window bounds, say. ``scale``: the scale of the train
        cell being checked (default the one this cell is bound to). Host reads."""
        names = {key: getattr(self, f"_{key}").name for key in STATE_PARAMETERS}
        names["loss_scale"] = scale_name
        state = self.get_state()
        try:
            check_adaptive_state(self._rule, state if scale is None else dataclasses.replace(state, scale=scale))
        except ValueError as error:
            message = str(error)
            for key, name in names.items():
                message = message.replace(f"state_dict[{key!r}]", name)
            raise ValueError(message) from None

    def state_dict(self):
        """``{'loss_scale', 'scale_window', 'list_index', 'window_up_count', 'window_down_count', 'cur_iter',
        'last_overflow_iter'}`` as Python numbers (read as :meth:`get_state` reads them)."""
        return adaptive_state_dict(self.get_state())

    def load_state_dict(self, state):
        """Restore :meth:`state_dict` output, validated against this cell's rule; nothing changes on error."""
        self.set_state(adaptive_state_from_dict(self._rule, state))

    def set_state(self, state):
        """Write an :class:`AdaptiveState` (checked against the rule first) into the Parameters."""
        state = check_adaptive_state(self._rule, state)
        for key, value in zip(STATE_PARAMETERS, dataclasses.astuple(state)[1:]):
            write_parameter(getattr(self, f"_{key}"), value)
        self._set_loss_scale(state.scale)

    def _next_scale(self, scale, overflow, grow):
        """Backed off (floored at 1) on overflow, grown (kept if not finite) after a clean window."""
        backed_off = ops.maximum(scale * self._inverse, self._floor)
        grown = scale * self._factor
        grown = ops.select(ops.logical_and(ops.isfinite(grown), grown <= self._ceiling), grown, scale)
        return ops.select(overflow, backed_off, ops.select(grow, grown, scale))

    def construct(self, loss_scale, overflow):
        check_overflow_argument(overflow)
        flag, overflow, scale = overflow, overflow.reshape(()), loss_scale.reshape(())
        window, level, ups, downs = self._scale_window, self._list_index, self._window_up_count, self._window_down_count
        step, last = self._cur_iter, self._last_overflow_iter
        grow = window <= step - last
        grew = ops.logical_and(grow, ops.logical_not(overflow))
        ups = ops.select(grew, (ups + self._one) % self._wrap, ups)
        downs = ops.select(grew, self._zero, downs)
        up = ops.logical_and(ups == self._moves, level != self._top)
        level = ops.select(up, level + self._one, level)
        ups = ops.select(up, self._zero, ups)
        window = ops.select(up, ops.gather(self._levels, ops.maximum(level, self._zero), 0), window)
        downs = ops.select(overflow, (downs + self._one) % self._wrap, downs)
        down = ops.logical_and(ops.logical_and(overflow, downs == self._moves), level > self._zero)
        window = ops.select(down, self._one, window)
        level = ops.select(down, self._hidden, level)
        downs, ups = ops.select(down, self._zero, downs), ops.select(down, self._zero, ups)
        new_scale = self._next_scale(scale, overflow, grow).reshape(loss_scale.shape)
        done = ops.assign(self._last_overflow_iter, ops.select(ops.logical_or(overflow, grow), step, last))
        done = ops.depend(ops.assign(self._cur_iter, step + self._one), done)
        done = ops.depend(ops.assign(self._scale_window, window), done)
        done = ops.depend(ops.assign(self._list_index, level), done)
        done = ops.depend(ops.assign(self._window_up_count, ups), done)
        done = ops.depend(ops.assign(self._window_down_count, downs), done)
        done = ops.depend(ops.assign(loss_scale, new_scale), done)
        return ops.depend(flag, done)
