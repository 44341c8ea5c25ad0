"""The adaptive-window rule against MindFormers' ``AdaptiveLossScaleUpdateCell``, transcribed statement by
statement from its source (``mindformers/wrapper/adaptive_loss_scale.py``, mindformers 2.1.0), in float32."""

import warnings
from dataclasses import astuple

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lossscale.core.adaptive import HIDDEN, AdaptiveState, AdaptiveWindowRule, run_adaptive, window_levels

F32 = np.float32


def mindformers_levels(max_scale_window, min_scale_window, window_interval=100, window_factor=2):
    """``_get_window_list``, transcribed."""
    window_list = [int(max_scale_window)]
    while max_scale_window > min_scale_window:
        if max_scale_window > window_interval:
            max_scale_window = int(max_scale_window / window_factor / window_interval) * window_interval
        elif max_scale_window == window_interval:
            max_scale_window = max_scale_window / window_factor
        else:
            max_scale_window = max_scale_window - min_scale_window / window_factor
        window_list.append(int(max_scale_window))
    window_list.reverse()
    return window_list


def mindformers_trajectory(loss_scale_value, scale_factor, scale_window, max_scale_window, min_scale_window, flags):
    """``AdaptiveLossScaleUpdateCell.construct`` for each overflow flag, transcribed with the cell's names; the
    state after each call as (scale, scale_window, list_index, up count, down count, cur_iter, last_overflow)."""
    window_list = mindformers_levels(max_scale_window, min_scale_window)
    list_index = window_list.index(scale_window) if scale_window in window_list else 0
    scale_window = window_list[list_index]
    up, down, cur_iter, last_overflow_iter = 0, 0, 1, 0
    loss_scale = F32(loss_scale_value)
    trajectory = []
    for overflow in flags:
        on_overflow = max(loss_scale * (F32(1) / F32(scale_factor)), F32(1)) if overflow else loss_scale
        should_inc = scale_window <= cur_iter - last_overflow_iter
        last_overflow_iter = cur_iter if (overflow or should_inc) else last_overflow_iter
        update_scale_cond = should_inc and not overflow
        with np.errstate(over="ignore"):
            loss_scale = on_overflow * F32(scale_factor) if update_scale_cond else on_overflow
        cur_iter += 1
        up = (up + 1) % 4 if update_scale_cond else up
        down = 0 if update_scale_cond else down
        window_up_cond = up == 3 and list_index != len(window_list) - 1
        list_index = list_index + 1 if window_up_cond else list_index
        up = 0 if window_up_cond else up
        cur_list_index = 0 if list_index == -1 else list_index
        scale_window = window_list[cur_list_index] if window_up_cond else scale_window
        down = (down + 1) % 4 if overflow else down
        window_down_cond = overflow and down == 3 and list_index not in (-1, 0)
        scale_window = 1 if window_down_cond else scale_window
        list_index = -1 if window_down_cond else list_index
        down = 0 if window_down_cond else down
        up = 0 if window_down_cond else up
        trajectory.append((float(loss_scale), scale_window, list_index, up, down, cur_iter, last_overflow_iter))
    return trajectory


def as_tuples(states):
    return [astuple(state) for state in states]


def _clean(n):
    return [False] * n


# (bounds, start window, overflow schedule): the moves the issue names, each checked step by step.
SCHEDULES = {
    "first growth after one window": ((1000, 20), 20, _clean(45)),
    "three growths move up one level": ((1000, 20), 20, _clean(20 * 3 + 40 * 3 + 5)),
    "growth to the top level and beyond": ((1000, 20), 20, _clean(20 * 3 + 40 * 3 + 50 * 3 + 100 * 3 + 200 * 3 + 10)),
    "three back-offs drop to the hidden level": ((1000, 20), 40, [True, True, True, False, False]),
    "back-offs at the lowest level stay there": ((1000, 20), 20, [True] * 5),
    "hidden level and back up to min": ((1000, 20), 50, [True] * 3 + _clean(8) + _clean(40)),
    "a growth between back-offs resets them": ((1000, 20), 40, [True, True] + _clean(41) + [True, True, True]),
    "start at the top": ((1000, 20), 1000, [True] * 3 + _clean(30)),
    "bounds not multiples of 100": ((250, 7), 8, _clean(300) + [True] * 4 + _clean(60)),
    "small bounds": ((30, 4), 4, _clean(100) + [True, False] * 6 + _clean(50)),
}


@pytest.mark.parametrize("case", sorted(SCHEDULES))
def test_the_rule_is_mindformers_step_by_step(case):
    (max_window, min_window), start, flags = SCHEDULES[case]
    rule = AdaptiveWindowRule(2.0**10, 2, start, max_scale_window=max_window, min_scale_window=min_window)
    expected = mindformers_trajectory(2.0**10, 2, start, max_window, min_window, flags)
    assert as_tuples(run_adaptive(rule, flags)) == expected


def test_the_schedules_reach_every_move():
    """The table above is not vacuous: it grows to the top level, drops to the hidden level and comes back."""
    levels_seen = set()
    for (max_window, min_window), start, flags in SCHEDULES.values():
        rule = AdaptiveWindowRule(2.0**10, 2, start, max_scale_window=max_window, min_scale_window=min_window)
        levels_seen |= {state.level for state in run_adaptive(rule, flags)}
    assert {HIDDEN, 0, 7} <= levels_seen
    hidden_then_up = SCHEDULES["hidden level and back up to min"]
    states = run_adaptive(AdaptiveWindowRule(2.0**10, 2, 50), hidden_then_up[2])
    assert [s.window for s in states][:3] == [50, 50, 1] and states[-1].window == 20 and states[-1].level == 0


@pytest.mark.parametrize(
    "bounds, levels",
    [
        ((1000, 20), (20, 30, 40, 50, 100, 200, 500, 1000)),
        ((250, 7), (4, 8, 11, 15, 18, 22, 25, 29, 32, 36, 39, 43, 46, 50, 100, 250)),
        ((100, 20), (20, 30, 40, 50, 100)),
        ((2, 1), (1, 1, 2)),  # MindFormers rounds 1.5 down to 1, twice
    ],
)
def test_window_levels(bounds, levels):
    assert window_levels(*bounds) == levels == tuple(mindformers_levels(*bounds))


def test_the_scale_never_grows_to_inf():
    """MindFormers multiplies 2**127 by 2 into inf (and then backs off to inf forever); the rule keeps 2**127,
    with the same window moves."""
    flags = _clean(25) + [True]
    ours = run_adaptive(AdaptiveWindowRule(2.0**127, 2, 20), flags)
    theirs = mindformers_trajectory(2.0**127, 2, 20, 1000, 20, flags)
    assert theirs[19][0] == np.inf and [s.scale for s in ours][:20] == [2.0**127] * 20
    assert ours[-1].scale == 2.0**126
    assert [t[1:] for t in as_tuples(ours)] == [t[1:] for t in theirs]


def test_a_scale_window_that_is_not_a_level_starts_at_the_lowest_with_a_warning():
    rule = AdaptiveWindowRule(2.0**10, 2, 35)
    with pytest.warns(UserWarning, match=r"scale_window=35 is not one of the window levels"):
        state = rule.initial_state()
    assert (state.window, state.level) == (20, 0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert AdaptiveWindowRule(2.0**10, 2, 500).initial_state() == AdaptiveState(1024.0, 500, 6)


@given(
    flags=st.lists(st.booleans(), max_size=400),
    bounds=st.sampled_from([(1000, 20), (250, 7), (30, 4), (120, 10)]),
    factor=st.sampled_from([2.0, 3.0, 1.5]),
    init=st.sampled_from([1.0, 3.0, 2.0**15, 2.0**126]),
)
def test_random_schedules_follow_mindformers(flags, bounds, factor, init):
    levels = window_levels(*bounds)
    rule = AdaptiveWindowRule(init, factor, levels[0], max_scale_window=bounds[0], min_scale_window=bounds[1])
    theirs = mindformers_trajectory(init, factor, levels[0], *bounds, flags)
    ours = as_tuples(run_adaptive(rule, flags))
    assert [state[1:] for state in ours] == [state[1:] for state in theirs]
    for our, their in zip(ours, theirs):  # equal scales until MindFormers' grows to inf, where ours stays finite
        assert our[0] == their[0] if np.isfinite(their[0]) else np.isfinite(our[0])


@pytest.mark.parametrize(
    "arguments, error, message",
    [
        ({"max_scale_window": 20, "min_scale_window": 20}, ValueError, "'max_scale_window' must be larger"),
        ({"max_scale_window": 10, "min_scale_window": 20}, ValueError, "'max_scale_window' must be larger"),
        ({"min_scale_window": 0}, ValueError, r"'min_scale_window' must be an int in \[1, 2147483647\], but got 0"),
        ({"max_scale_window": -5}, ValueError, r"'max_scale_window' must be an int in \[1, 2147483647\], but got -5"),
        ({"max_scale_window": 2**31}, ValueError, "'max_scale_window' must be an int in .*, but got 2147483648"),
        ({"max_scale_window": 1000.0}, TypeError, "'max_scale_window' must be an int, but got 1000.0"),
        ({"min_scale_window": True}, TypeError, "'min_scale_window' must be an int"),
        ({"init_scale": 0.5}, ValueError, "'init_scale'"),
        ({"init_scale": float("inf")}, ValueError, "'init_scale'"),
        ({"scale_factor": 1.0}, ValueError, "'scale_factor'"),
    ],
)
def test_bad_arguments_name_the_argument(arguments, error, message):
    with pytest.raises(error, match=message):
        AdaptiveWindowRule(**dict({"init_scale": 1024.0, "scale_factor": 2, "scale_window": 20}, **arguments))
