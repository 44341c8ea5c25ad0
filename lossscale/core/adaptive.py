"""The adaptive scale window of MindFormers' ``AdaptiveLossScaleUpdateCell``, as a pure rule.

A dynamic loss scale with a fixed growth window is either slow to raise the scale early in training or, once
the scale is right, keeps raising it and skips steps. MindFormers (``mindformers/wrapper/adaptive_loss_scale.py``,
package ``mindformers`` 2.1.0) lets the window move between levels. This module is that rule, written from
its source, in float32 as the device computes it; the graph cell is tested against it.

Levels: from ``max_scale_window`` down to ``min_scale_window`` (:func:`window_levels`), lowest first. Training
starts at the level of ``scale_window`` (the lowest, with a warning, if it is not a level). Per step::

    if overflow:
        scale = max(scale * (1 / factor), 1)             # never below 1
    grow = window <= step - last_step                    # a whole window since the last overflow or growth
    if overflow or grow:
        last_step = step
    if grow and not overflow:
        scale = scale * factor                           # float32; kept if that is not finite
        ups, downs = (ups + 1) % 4, 0
    step += 1
    if ups == 3 and level != top:                        # three growths: one level up (from the hidden
        level, ups = level + 1, 0                        # level 1 up to min_scale_window)
        window = levels[level]
    if overflow:
        downs = (downs + 1) % 4
    if overflow and downs == 3 and level > 0:            # three back-offs without growth: the hidden level,
        window, level, ups, downs = 1, HIDDEN, 0, 0      # a window of 1

The counters wrap modulo 4 as MindFormers' do, so a fourth growth at the top level (or a fourth back-off at
the lowest) starts them again. One difference: MindFormers lets the scale grow to inf, which then backs off to
inf forever; here a growth that is not finite keeps the scale (as every rule of lossscale does).

Example:
    >>> rule = AdaptiveWindowRule(init_scale=2.0**10, scale_factor=2, scale_window=20)
    >>> rule.levels, rule.initial_state().window
    ((20, 30, 40, 50, 100, 200, 500, 1000), 20)
    >>> [state.scale for state in run_adaptive(rule, [True, False])]
    [512.0, 512.0]
"""

import warnings
from dataclasses import dataclass, field
from typing import Iterable, List, Optional, Tuple

import numpy as np

from lossscale.core._validation import (
    FLOAT32_MAX,
    INT32_MAX,
    check_finite_in_range,
    check_int_in_range,
    refuse_float32_degenerate,
)

HIDDEN = -1  # the level of the window of 1, below the lowest level
WINDOW_INTERVAL, WINDOW_FACTOR = 100, 2  # MindFormers' constants for the levels
MOVES = 3  # growths (or back-offs without a growth) that move the window one level
# MindFormers' default bounds, as its code has them (its docstring swaps the two).
MAX_SCALE_WINDOW, MIN_SCALE_WINDOW = 1000, 20
_F32 = np.float32


def window_levels(max_scale_window, min_scale_window):
    """MindFormers' window levels, lowest first: from ``max_scale_window``, halved and rounded down to a
    multiple of 100 while above 100, 100 halves to 50, and below 100 steps of ``min_scale_window / 2``, until
    a level is ``min_scale_window`` or below.

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


def _check_window_bounds(max_scale_window, min_scale_window):
    """MindFormers' conditions, as errors naming the argument: both ints, > 0, and max > min; and what the device
    holds: int32 windows (a larger one would wrap to a negative window)."""
    for name, value in (("max_scale_window", max_scale_window), ("min_scale_window", min_scale_window)):
        check_int_in_range(name, value, low=1, high=INT32_MAX)
    if max_scale_window <= min_scale_window:
        raise ValueError(
            f"'max_scale_window' must be larger than 'min_scale_window', but got {max_scale_window} <= "
            f"{min_scale_window}."
        )


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
        """The window as a count of steps: a window of 0 (MindFormers' levels of a ``max_scale_window`` between 101
        and 199 include one) grows at every step, as a window of 1 does."""
        return max(self.window, 1)

    @property
    def good_steps(self):
        """Steps since the last growth or overflow (PyTorch's ``_growth_tracker``): the rule grows at the
        ``growth_interval``-th. Only the difference of the two step numbers matters to the rule."""
        return min(self.step - self.last_step - 1, self.growth_interval - 1)


@dataclass(frozen=True)
class AdaptiveWindowRule:
    """MindFormers' adaptive rule, with its argument names and defaults (see the module docstring).

    Args:
        init_scale (float): the initial scale (MindFormers' ``loss_scale_value``), finite and >= 1.
        scale_factor (float): growth and back-off factor, > 1.
        scale_window (int): the starting window; not a level: the lowest level, with a ``UserWarning``.
        max_scale_window (int): the top level (default 1000).
        min_scale_window (int): the lowest level (default 20); 0 < min < max.
    """

    init_scale: float
    scale_factor: float
    scale_window: int
    max_scale_window: int = MAX_SCALE_WINDOW
    min_scale_window: int = MIN_SCALE_WINDOW
    levels: Tuple[int, ...] = field(init=False, repr=False)

    def __post_init__(self):
        object.__setattr__(self, "init_scale", check_finite_in_range("init_scale", self.init_scale, low=1.0))
        factor = check_finite_in_range("scale_factor", self.scale_factor, low=1.0, low_inclusive=False)
        refuse_float32_degenerate("scale_factor", factor, _F32(factor) <= 1.0, "rounds to 1.0")
        object.__setattr__(self, "scale_factor", factor)
        check_int_in_range("scale_window", self.scale_window, low=0, high=INT32_MAX)
        _check_window_bounds(self.max_scale_window, self.min_scale_window)
        object.__setattr__(self, "levels", window_levels(self.max_scale_window, self.min_scale_window))

    # What the readers of a fixed-window rule ask for (a GradScaler's getters, the bounds of a scale it sets).
    hysteresis = 1
    floor, ceiling = 1.0, FLOAT32_MAX

    @property
    def growth_factor(self):
        """``scale_factor``: the growth multiplier."""
        return float(self.scale_factor)

    @property
    def backoff_factor(self):
        """``1 / scale_factor`` in float32, as the rule backs off."""
        return float(_F32(1.0) / _F32(self.scale_factor))

    @property
    def growth_interval(self):
        """The starting window (the lowest level if ``scale_window`` is not one)."""
        return self.scale_window if self.scale_window in self.levels else self.levels[0]

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

    def initial_state(self):
        """The state before the first step."""
        level = self.start_level()
        return AdaptiveState(scale=float(_F32(self.init_scale)), window=self.levels[level], level=level)

    def window_of(self, level):
        """The window of ``level`` (1 at :data:`HIDDEN`)."""
        return 1 if level == HIDDEN else self.levels[level]


def _scale_after(rule, scale, overflow, grow):
    """The float32 scale after this step: backed off (floored at 1) on overflow, grown on a clean window."""
    scale = _F32(scale)
    if overflow:
        scale = max(scale * (_F32(1.0) / _F32(rule.scale_factor)), _F32(1.0))  # MindFormers' reciprocal
    elif grow:
        with np.errstate(over="ignore"):
            grown = scale * _F32(rule.scale_factor)
        scale = grown if np.isfinite(grown) and grown <= FLOAT32_MAX else scale
    return float(scale)


def update_adaptive(rule: AdaptiveWindowRule, state: AdaptiveState, overflow: bool) -> AdaptiveState:
    """The state after one step that did (``overflow=True``) or did not overflow; pure.

    Example:
        >>> rule = AdaptiveWindowRule(init_scale=8.0, scale_factor=2, scale_window=20)
        >>> update_adaptive(rule, rule.initial_state(), True)
        AdaptiveState(scale=4.0, window=20, level=0, ups=0, downs=1, step=2, last_step=1)
    """
    grow = state.window <= state.step - state.last_step
    ups, downs, level, window = state.ups, state.downs, state.level, state.window
    if grow and not overflow:
        ups, downs = (ups + 1) % (MOVES + 1), 0
    if ups == MOVES and level != len(rule.levels) - 1:
        level, ups = level + 1, 0
        window = rule.window_of(level)
    if overflow:
        downs = (downs + 1) % (MOVES + 1)
        if downs == MOVES and level not in (HIDDEN, 0):
            window, level, ups, downs = 1, HIDDEN, 0, 0
    return AdaptiveState(
        scale=_scale_after(rule, state.scale, overflow, grow),
        window=window,
        level=level,
        ups=ups,
        downs=downs,
        step=state.step + 1,
        last_step=state.step if (overflow or grow) else state.last_step,
    )


def run_adaptive(
    rule: AdaptiveWindowRule, overflows: Iterable[bool], state: Optional[AdaptiveState] = None
) -> List[AdaptiveState]:
    """:func:`update_adaptive` for each overflow flag; the state after every step.

    Example:
        >>> rule = AdaptiveWindowRule(init_scale=4.0, scale_factor=2, scale_window=20)
        >>> [s.scale for s in run_adaptive(rule, [False] * 20)][-2:]  # grows on the 20th clean step
        [4.0, 8.0]
    """
    state = rule.initial_state() if state is None else state
    trajectory = []
    for overflow in overflows:
        state = update_adaptive(rule, state, bool(overflow))
        trajectory.append(state)
    return trajectory
