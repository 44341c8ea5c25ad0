"""MindFormers' adaptive scale window (``AdaptiveLossScaleUpdateCell``) as a rule: :class:`AdaptiveWindowRule`.

The growth window moves between levels (:func:`window_levels`, from ``min_scale_window`` up to
``max_scale_window``): three growths move it one level up, three back-offs without a growth drop it to a hidden
window of 1. Written from MindFormers' source (``mindformers/wrapper/adaptive_loss_scale.py``, 2.1.0) and tested
step by step against a transcription of it; unlike MindFormers the scale never grows to inf. The algorithm is in
docs/design.md, section 1.

Example:
    >>> rule = AdaptiveWindowRule(init_scale=2.0**10, scale_factor=2, scale_window=20)
    >>> rule.levels, rule.initial_state().window
    ((20, 30, 40, 50, 100, 200, 500, 1000), 20)
    >>> [state.scale for state in run_adaptive(rule, [True, False])]
    [512.0, 512.0]
"""

import warnings
from dataclasses import dataclass, field
from typing import Tuple

import numpy as np
from mindspore import Tensor, ops
from mindspore.common import dtype as mstype

from lossscale.core._validation import (
    FLOAT32_MAX,
    INT32_MAX,
    check_finite_in_range,
    check_int_in_range,
    refuse_float32_degenerate,
)
from lossscale.core.rule import (
    LossScaleRule,
    StateField,
    advance,
    as_mapping,
    host_or_graph,
    isfinite,
    logical_and,
    logical_not,
    logical_or,
    maximum,
    minimum,
    run,
    where,
)
from lossscale.core.spelling import MINDFORMERS_CELL, errors_named
from lossscale.core.update_cells import LossScaleUpdateCell

HIDDEN = -1  # the level of the window of 1, below the lowest level
WINDOW_INTERVAL, WINDOW_FACTOR = 100, 2  # MindFormers' constants for the levels
MOVES = 3  # growths (or back-offs without a growth) that move the window one level
# MindFormers' default bounds, as its code has them (its docstring swaps the two).
MAX_SCALE_WINDOW, MIN_SCALE_WINDOW = 1000, 20
_F32 = np.float32


def window_levels(max_scale_window, min_scale_window):
    """MindFormers' window levels, lowest first: from ``max_scale_window``, halved and rounded down to a multiple of
    100 while above 100, 100 halves to 50, and below 100 steps of ``min_scale_window / 2``, until a level is
    ``min_scale_window`` or below.

    Example:
        >>> window_levels(1000, 20)
        (20, 30, 40, 50, 100, 200, 500, 1000)
    """
    level, levels = max_scale_window, [int(max_scale_window)]
    while level > min_scale_window:
        if level > WINDOW_INTERVAL:
            level = int(level / WINDOW_FACTOR / WINDOW_INTERVAL) * WINDOW_INTERVAL
        elif level == WINDOW_INTERVAL:
            level = level / WINDOW_FACTOR
        else:
            level = level - min_scale_window / WINDOW_FACTOR
        levels.append(int(level))
    return tuple(reversed(levels))


@dataclass(frozen=True)
class AdaptiveState:
    """The rule's state: the scale and MindFormers' six counters (``cur_iter`` starts at 1)."""

    scale: float
    window: int
    level: int
    ups: int = 0
    downs: int = 0
    step: int = 1
    last_step: int = 0

    @property
    def growth_interval(self):
        """The window as a count of steps: a window of 0 (among the levels of a ``max_scale_window`` between 101 and
        199) grows at every step, as a window of 1 does."""
        return max(self.window, 1)

    @property
    def good_steps(self):
        """Steps since the last growth or overflow (PyTorch's ``_growth_tracker``): the rule grows at the
        ``growth_interval``-th. Only the difference of the two step numbers matters to the rule."""
        return min(self.step - self.last_step - 1, self.growth_interval - 1)


def _picked(levels, index):
    """``levels[index]`` for a constant tuple ``levels`` and an int32 index (a NumPy scalar or a Tensor)."""
    if isinstance(index, Tensor):
        return ops.gather(Tensor(levels, mstype.int32), index.reshape(()), 0)
    return np.int32(levels[index])


@dataclass(frozen=True)
class AdaptiveWindowRule(LossScaleRule):
    """MindFormers' adaptive rule, with its argument names and defaults.

    Args:
        init_scale (float): the initial scale (MindFormers' ``loss_scale_value``), finite and >= 1.
        scale_factor (float): growth and back-off factor, > 1.
        scale_window (int): the starting window; not a level: the lowest level, with a ``UserWarning``.
        max_scale_window (int): the top level (default 1000).
        min_scale_window (int): the lowest level (default 20); 0 < min < max < 2**31.

    Example:
        >>> rule = AdaptiveWindowRule(init_scale=8.0, scale_factor=2, scale_window=20)
        >>> rule.levels[:3], advance(rule, rule.initial_state(), True).scale
        ((20, 30, 40), 4.0)
    """

    init_scale: float
    scale_factor: float
    scale_window: int
    max_scale_window: int = MAX_SCALE_WINDOW
    min_scale_window: int = MIN_SCALE_WINDOW
    levels: Tuple[int, ...] = field(init=False, repr=False)

    # MindFormers' Parameter names (and state-dict keys): its checkpoints load into the cell.
    fields = (
        StateField("window", key="scale_window", parameter="scale_window"),
        StateField("level", key="list_index", parameter="list_index"),
        StateField("ups", key="window_up_count", parameter="scale_window_up_count"),
        StateField("downs", key="window_down_count", parameter="scale_window_down_count"),
        StateField("step", key="cur_iter", parameter="current_iterator_step"),
        StateField("last_step", key="last_overflow_iter", parameter="last_overflow_iterator_step"),
    )

    def __post_init__(self):
        object.__setattr__(self, "init_scale", check_finite_in_range("init_scale", self.init_scale, low=1.0))
        factor = check_finite_in_range("scale_factor", self.scale_factor, low=1.0, low_inclusive=False)
        refuse_float32_degenerate("scale_factor", factor, _F32(factor) <= 1.0, "rounds to 1.0")
        object.__setattr__(self, "scale_factor", factor)
        check_int_in_range("scale_window", self.scale_window, low=0, high=INT32_MAX)
        for name in ("max_scale_window", "min_scale_window"):  # int32 windows: a larger one wraps on the device
            check_int_in_range(name, getattr(self, name), low=1, high=INT32_MAX)
        if self.max_scale_window <= self.min_scale_window:
            raise ValueError(
                f"'max_scale_window' must be larger than 'min_scale_window', but got {self.max_scale_window} <= "
                f"{self.min_scale_window}."
            )
        object.__setattr__(self, "levels", window_levels(self.max_scale_window, self.min_scale_window))

    @property
    def backoff_factor(self):
        """``1 / scale_factor`` in float32, as the rule backs off."""
        return float(_F32(1.0) / _F32(self.scale_factor))

    def start_level(self):
        """The level training starts at: ``scale_window``'s, or the lowest (with a warning) if it is not one."""
        if self.scale_window in self.levels:
            return self.levels.index(self.scale_window)
        warnings.warn(
            f"scale_window={self.scale_window!r} is not one of the window levels {list(self.levels)}: training "
            f"starts at the lowest, {self.levels[0]} (as MindFormers does).",
            UserWarning,
            stacklevel=3,
        )
        return 0

    def window_of(self, level):
        """The window of ``level`` (1 at :data:`HIDDEN`)."""
        return 1 if level == HIDDEN else self.levels[level]

    # ---- the rule protocol ------------------------------------------------------------------------------------
    def settings(self):
        return dict(factor=self.scale_factor, inverse=self.backoff_factor)

    def initial_state(self):
        level = self.start_level()
        return AdaptiveState(scale=float(_F32(self.init_scale)), window=self.levels[level], level=level)

    def update(self, overflow, statistics, scale, window, level, ups, downs, step, last, factor, inverse):
        grow = window <= step - last  # a whole window since the last overflow or growth
        grew = logical_and(grow, logical_not(overflow))
        ups, downs = where(grew, (ups + 1) % (MOVES + 1), ups), where(grew, 0, downs)
        up = logical_and(ups == MOVES, level != len(self.levels) - 1)  # three growths: one level up
        level, ups = where(up, level + 1, level), where(up, 0, ups)
        window = where(up, _picked(self.levels, maximum(level, 0)), window)
        downs = where(overflow, (downs + 1) % (MOVES + 1), downs)
        down = logical_and(logical_and(overflow, downs == MOVES), level > 0)  # three back-offs: the hidden level
        grown = scale * factor
        grown = where(logical_and(isfinite(grown), grown <= FLOAT32_MAX), grown, scale)  # never to inf
        backed_off = maximum(scale * inverse, 1.0)
        return (
            where(overflow, backed_off, where(grow, grown, scale)),
            where(down, 1, window),
            where(down, HIDDEN, level),
            where(down, 0, ups),
            where(down, 0, downs),
            step + 1,
            where(logical_or(overflow, grow), step, last),
        )

    def scale_bounds(self):
        return 1.0, FLOAT32_MAX

    def check_state(self, state, names=None):
        """``ValueError`` naming the entry unless a cell of this rule can hold ``state``.

        Example:
            >>> rule = AdaptiveWindowRule(8.0, 2, 20)
            >>> rule.check_state(dict(scale=8.0, window=40, level=0, ups=0, downs=0, step=1, last_step=0))
            Traceback (most recent call last):
            ...
            ValueError: 'state_dict['scale_window']' must be the window of level 0, 20, but got 40.
        """
        names = names or {field.name: f"state_dict[{field.key!r}]" for field in self.fields}
        names.setdefault("scale", "state_dict['loss_scale']")
        check_finite_in_range(names["scale"], state["scale"], low=1.0, high=FLOAT32_MAX)
        level = check_int_in_range(names["level"], state["level"], low=HIDDEN, high=len(self.levels) - 1)
        if state["window"] != self.window_of(level):
            raise ValueError(
                f"'{names['window']}' must be the window of level {level}, {self.window_of(level)}, but got "
                f"{state['window']}."
            )
        check_int_in_range(names["ups"], state["ups"], low=0, high=MOVES)
        check_int_in_range(names["downs"], state["downs"], low=0, high=MOVES)
        check_int_in_range(names["step"], state["step"], low=1)
        check_int_in_range(names["last_step"], state["last_step"], low=0, high=state["step"] - 1)
        return state

    def view(self, scale, window, level, ups, downs, step, last, factor, inverse):
        """A fixed-window rule now, whose window is the current one (a window of 0 grows as one of 1)."""
        growth_interval = maximum(window, 1)
        good_steps = minimum(step - last - 1, growth_interval - 1)
        factor = host_or_graph(factor, float(self.scale_factor))
        return scale, factor, host_or_graph(inverse, self.backoff_factor), growth_interval, 1, good_steps, 0

    def extras(self, state):
        """The window bounds and the window state (MindFormers' names), besides the view."""
        state = as_mapping(self, state)
        return dict(
            max_scale_window=self.max_scale_window,
            min_scale_window=self.min_scale_window,
            list_index=state["level"],
            window_up_count=state["ups"],
            window_down_count=state["downs"],
        )

    def from_view(self, values, names, implied):
        """The window state of a front-end's state dict, checked against this rule (its factor and levels are fixed
        when it is built); the saved scale also becomes the initial scale."""
        missing = [key for key in self.extras(self.initial_state()) if key not in values]
        if missing:
            raise ValueError(
                f"this scaler's rule is MindFormers' adaptive window, but 'state_dict' holds a fixed-window state (no "
                f"{missing}): load it into a scaler built with a fixed-window rule."
            )
        expected = dict(growth_factor=self.scale_factor, backoff_factor=self.backoff_factor, hysteresis=1, bad_steps=0)
        expected.update(max_scale_window=self.max_scale_window, min_scale_window=self.min_scale_window)
        for name, value in expected.items():
            if name in values and values[name] != value:
                raise ValueError(
                    f"'{names[name]}' is {values[name]!r}, but this scaler's adaptive window rule has {value!r} (its "
                    f"factor and window levels are fixed when it is built): load it into a scaler built with the "
                    f"rule that saved it."
                )
        scale = check_finite_in_range(names["scale"], values["scale"], low=1.0, high=FLOAT32_MAX)
        level = check_int_in_range(names["list_index"], values["list_index"], low=HIDDEN, high=len(self.levels) - 1)
        start = AdaptiveState(float(scale), self.window_of(level), level)
        if values["growth_interval"] != start.growth_interval:
            raise ValueError(
                f"'{names['growth_interval']}' must be the window of level {level} ({names['list_index']}), "
                f"{start.growth_interval}, but got {values['growth_interval']!r}."
            )
        good = check_int_in_range(names["good_steps"], values["good_steps"], low=0, high=start.growth_interval - 1)
        ups, downs = values["window_up_count"], values["window_down_count"]
        state = AdaptiveState(start.scale, start.window, level, ups, downs, step=good + 1, last_step=0)
        names = {field.name: names.get(field.key, field.key) for field in self.fields}
        self.check_state(dict(vars(state)), dict(names, scale=names.get("scale", "state_dict['scale']")))
        return self.restarted(float(scale)), state

    def as_state(self, state):
        return AdaptiveState(**state)


def update_adaptive(rule, state, overflow):
    """The state after one step that did (``overflow=True``) or did not overflow; pure.

    Example:
        >>> rule = AdaptiveWindowRule(init_scale=8.0, scale_factor=2, scale_window=20)
        >>> update_adaptive(rule, rule.initial_state(), True)
        AdaptiveState(scale=4.0, window=20, level=0, ups=0, downs=1, step=2, last_step=1)
    """
    return advance(rule, state, bool(overflow))


def run_adaptive(rule, overflows, state=None):
    """:func:`update_adaptive` for each overflow flag; the state after every step.

    Example:
        >>> rule = AdaptiveWindowRule(init_scale=4.0, scale_factor=2, scale_window=20)
        >>> [s.scale for s in run_adaptive(rule, [False] * 20)][-2:]  # grows on the 20th clean step
        [4.0, 8.0]
    """
    return run(rule, [bool(overflow) for overflow in overflows], state)


class AdaptiveLossScaleUpdateCell(LossScaleUpdateCell):
    """MindFormers' ``AdaptiveLossScaleUpdateCell``: its arguments, defaults, call contract and Parameter names
    (``scale_window``, ``list_index``, ``scale_window_up_count``, ``scale_window_down_count``,
    ``current_iterator_step``, ``last_overflow_iterator_step``), so a MindFormers checkpoint's window state loads.

    Args:
        loss_scale_value (float): the initial scale, finite and >= 1.
        scale_factor (float): growth and back-off factor, > 1.
        scale_window (int): the starting window: one of the levels, else the lowest (with a warning).
        max_scale_window (int): the top level (default 1000, MindFormers' code; its docstring swaps the defaults).
        min_scale_window (int): the lowest level (default 20); ``0 < min_scale_window < max_scale_window``.

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
        *,
        mutable=False,
    ):
        with errors_named(MINDFORMERS_CELL):
            rule = AdaptiveWindowRule(loss_scale_value, scale_factor, scale_window, max_scale_window, min_scale_window)
        super().__init__(rule, mutable=mutable, loss_scale_value=loss_scale_value)

    @classmethod
    def from_rule(cls, rule, mutable=False):
        """The cell of an :class:`AdaptiveWindowRule`: :meth:`of_rule`.

        Example:
            >>> AdaptiveLossScaleUpdateCell.from_rule(AdaptiveWindowRule(8.0, 2, 40)).state_dict()["scale_window"]
            40
        """
        return cls.of_rule(rule, mutable)


AdaptiveWindowRule.cell_class = AdaptiveLossScaleUpdateCell
