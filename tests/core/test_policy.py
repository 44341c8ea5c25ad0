"""The pure policy: trajectory tables (jmp style) and argument validation."""

import math
import types

import numpy as np
import pytest

from lossscale.core.policy import (
    LossScalePolicy,
    LossScaleState,
    check_state,
    initial_state,
    run,
    state_from_dict,
    state_value,
    update,
)

T, F = True, False
F32_MAX = float(np.finfo(np.float32).max)

# (policy kwargs, overflow flags, expected scale after every step)
TRAJECTORIES = {
    "grows_on_the_window_th_clean_step": (
        dict(init_scale=8.0, growth_interval=3),
        [F, F, F, F, F, F],
        [8, 8, 16, 16, 16, 32],
    ),
    "window_1_grows_every_step": (dict(init_scale=1.0, growth_interval=1), [F, F, F], [2, 4, 8]),
    "overflow_backs_off_and_resets_the_window": (
        dict(init_scale=8.0, growth_interval=2),
        [F, T, F, F, T, T],
        [8, 4, 4, 8, 4, 2],
    ),
    "floor_at_one_by_default": (dict(init_scale=2.0, growth_interval=100), [T, T, T], [1, 1, 1]),
    "floor_at_min_scale": (dict(init_scale=64.0, growth_interval=100, min_scale=16.0), [T, T, T, T], [32, 16, 16, 16]),
    "no_floor_flushes_subnormals_to_zero": (  # below the smallest normal float32 the scale is 0
        dict(init_scale=2.0**-124, growth_interval=100, min_scale=0.0),
        [T] * 4,
        [2.0**-125, 2.0**-126, 0.0, 0.0],
    ),
    "ceiling_caps_growth": (dict(init_scale=100.0, growth_interval=1, max_scale=300.0), [F, F, F], [200, 300, 300]),
    "never_grows_to_inf": (
        dict(init_scale=2.0**127, growth_interval=1),
        [F, F, T, F],
        [2.0**127, 2.0**127, 2.0**126, 2.0**127],
    ),
    "factor_4_backoff_quarter": (
        dict(init_scale=256.0, growth_factor=4.0, growth_interval=1),
        [F, T, T],
        [1024, 256, 64],
    ),
    "explicit_backoff_factor": (dict(init_scale=256.0, backoff_factor=0.25, growth_interval=10), [T, T], [64, 16]),
    "hysteresis_2_backs_off_on_second_overflow": (
        dict(init_scale=64.0, growth_interval=3, hysteresis=2),
        [T, T, T, F, F, F, T],
        [64, 32, 16, 16, 16, 32, 32],
    ),
    "hysteresis_default_mode_not_refilled_by_clean_step": (
        dict(init_scale=64.0, growth_interval=10, hysteresis=2),
        [T, F, T],
        [64, 64, 32],
    ),
    "hysteresis_consecutive_mode_refilled_by_clean_step": (
        dict(init_scale=64.0, growth_interval=10, hysteresis=2, consecutive_hysteresis=True),
        [T, F, T, T],
        [64, 64, 64, 32],
    ),
    "hysteresis_absorbed_overflow_still_resets_window": (
        dict(init_scale=64.0, growth_interval=2, hysteresis=3),
        [F, T, F, F],
        [64, 64, 64, 128],
    ),
}


@pytest.mark.parametrize("name", sorted(TRAJECTORIES))
def test_trajectory_table(name):
    kwargs, flags, expected = TRAJECTORIES[name]
    scales = [state.scale for state in run(LossScalePolicy(**kwargs), flags)]
    assert scales == [float(s) for s in expected]


def test_mindspore_defaults():
    policy = LossScalePolicy()
    assert (policy.init_scale, policy.growth_factor, policy.backoff_factor, policy.growth_interval) == (
        2.0**24,
        2.0,
        0.5,
        2000,
    )
    assert (policy.hysteresis, policy.consecutive_hysteresis, policy.min_scale, policy.max_scale) == (
        1,
        False,
        1.0,
        None,
    )


def test_backoff_default_is_float32_reciprocal():
    policy = LossScalePolicy(growth_factor=3.0)
    assert policy.backoff_factor == float(np.float32(1) / np.float32(3))
    assert update(policy, LossScaleState(scale=3.0), True).scale == float(np.float32(3) * np.float32(1 / 3))


def test_counters_stay_bounded_over_a_long_clean_run():
    policy = LossScalePolicy(init_scale=1.0, growth_interval=7, hysteresis=3, max_scale=4.0)
    states = run(policy, [False] * 10_000)
    assert max(s.good_steps for s in states) == 6
    assert {s.hysteresis_left for s in states} == {3}
    assert states[-1].scale == 4.0


def test_update_is_pure():
    policy = LossScalePolicy(init_scale=4.0, growth_interval=1)
    state = initial_state(policy)
    update(policy, state, False)
    assert state == LossScaleState(scale=4.0, good_steps=0, hysteresis_left=1)


def test_growth_guard_near_float32_max():
    policy = LossScalePolicy(init_scale=F32_MAX, growth_interval=1)
    assert all(s.scale == F32_MAX and math.isfinite(s.scale) for s in run(policy, [False] * 5))


BAD_ARGUMENTS = [
    (dict(growth_factor=0.5), ValueError, "growth_factor"),
    (dict(growth_factor=1.0), ValueError, "growth_factor"),
    (dict(growth_factor=float("inf")), ValueError, "growth_factor"),
    (dict(growth_factor="2"), TypeError, "growth_factor"),
    (dict(backoff_factor=1.0), ValueError, "backoff_factor"),
    (dict(backoff_factor=0.0), ValueError, "backoff_factor"),
    (dict(backoff_factor=1.0 - 1e-9), ValueError, "backoff_factor"),  # 1.0 in float32: the scale would never fall
    (dict(growth_interval=0), ValueError, "growth_interval"),
    (dict(growth_interval=2.5), TypeError, "growth_interval"),
    (dict(growth_interval=True), TypeError, "growth_interval"),
    (dict(growth_interval=2**31), ValueError, "growth_interval"),
    (dict(hysteresis=0), ValueError, "hysteresis"),
    (dict(consecutive_hysteresis=1), TypeError, "consecutive_hysteresis"),
    (dict(init_scale=0.5), ValueError, "init_scale"),
    (dict(init_scale=float("nan")), ValueError, "init_scale"),
    (dict(init_scale=float("inf")), ValueError, "init_scale"),
    (dict(init_scale=1e39), ValueError, "init_scale"),
    (dict(min_scale=-1.0), ValueError, "min_scale"),
    (dict(init_scale=8.0, max_scale=4.0), ValueError, "init_scale"),
    (dict(min_scale=8.0, max_scale=4.0, init_scale=8.0), ValueError, "max_scale"),
    (dict(min_scale=0.0, max_scale=0.0), ValueError, "max_scale"),  # with no floor a scale must still be > 0
]


@pytest.mark.parametrize("kwargs, error, argument", BAD_ARGUMENTS)
def test_bad_arguments_name_the_argument_and_the_value(kwargs, error, argument):
    with pytest.raises(error) as info:
        LossScalePolicy(**kwargs)
    message = str(info.value)
    assert f"'{argument}'" in message
    assert repr(kwargs[argument]) in message


def test_init_scale_below_one_allowed_when_min_scale_allows():
    assert LossScalePolicy(init_scale=0.25, min_scale=0.0).init_scale == 0.25


@pytest.mark.parametrize(
    "state, field",
    [
        (LossScaleState(scale=0.5), "state.scale"),
        (LossScaleState(scale=2.0**17), "state.scale"),  # above max_scale
        (LossScaleState(scale=4.0, good_steps=4), "state.good_steps"),
        (LossScaleState(scale=4.0, good_steps=-1), "state.good_steps"),
        (LossScaleState(scale=4.0, hysteresis_left=0), "state.hysteresis_left"),
        (LossScaleState(scale=4.0, hysteresis_left=3), "state.hysteresis_left"),
    ],
)
def test_check_state_rejects_unreachable_states(state, field):
    with pytest.raises(ValueError, match=field):
        check_state(LossScalePolicy(init_scale=8.0, growth_interval=4, hysteresis=2, max_scale=2.0**16), state)


_POLICY = LossScalePolicy(init_scale=8.0, growth_interval=2)


@pytest.mark.parametrize(
    "arguments, error, pattern",
    [
        ((None, LossScaleState(scale=8.0), True), TypeError, "'policy' must be a LossScalePolicy, but got NoneType"),
        ((_POLICY, None, True), TypeError, "'state' must be a LossScaleState .*, but got NoneType"),
        ((_POLICY, LossScaleState(scale=8.0), "no"), TypeError, "'overflow' must be a bool, but got 'no' of type str"),
        ((_POLICY, LossScaleState(scale=8.0), 1), TypeError, "'overflow' must be a bool, but got 1 of type int"),
        ((_POLICY, LossScaleState(scale=8.0, good_steps=5), False), ValueError, "state.good_steps"),
        ((_POLICY, LossScaleState(scale=float("nan")), False), ValueError, "state.scale"),
    ],
)
def test_update_refuses_what_no_step_can_be(arguments, error, pattern):
    """The specification ran on anything: a flag "no" (truthy) backed off, a state past the growth window grew, an
    AttributeError for a missing state. Now each is refused, naming the argument."""
    with pytest.raises(error, match=pattern):
        update(*arguments)


def test_run_takes_bools_and_numpy_bools_only():
    assert [s.scale for s in run(_POLICY, np.array([True, False, False]))] == [4.0, 4.0, 8.0]
    with pytest.raises(TypeError, match="'overflow' must be a bool, but got 'T' of type str"):
        run(_POLICY, "TF")  # was two overflows, one per character


@pytest.mark.parametrize(
    "policy, overflows, bound, outward",
    [
        (LossScalePolicy(init_scale=1.0, growth_interval=5, min_scale=0.7), [True] * 3, 0.7, 0.0),
        (LossScalePolicy(init_scale=0.25, growth_interval=1, min_scale=0.0, max_scale=0.3), [False] * 3, 0.3, 1.0),
    ],
    ids=["floor", "ceiling"],
)
def test_check_state_accepts_the_float32_bound_the_rule_reaches(policy, overflows, bound, outward):
    """A bound that float32 rounds outward (the floor 0.7 -> 0.69999999, the ceiling 0.3 -> 0.30000001) is a state
    the rule reaches; a hair further out is not."""
    reached = run(policy, overflows)[-1]
    assert reached.scale == float(np.float32(bound))
    assert (reached.scale < bound) if outward < bound else (reached.scale > bound)
    assert check_state(policy, reached) == reached
    beyond = LossScaleState(scale=float(np.nextafter(np.float32(bound), np.float32(outward))))
    with pytest.raises(ValueError, match="state.scale"):
        check_state(policy, beyond)


def test_the_initial_state_holds_the_scale_as_the_device_does():
    """init_scale rounded to float32 (0.3 -> 0.30000001), as the scale Parameter holds it."""
    assert initial_state(LossScalePolicy(init_scale=0.3, min_scale=0.0)).scale == float(np.float32(0.3)) != 0.3


def test_a_state_dict_may_be_any_mapping():
    saved = types.MappingProxyType({"loss_scale": 4.0, "good_steps": 1, "hysteresis_left": 1})
    assert state_from_dict(LossScalePolicy(init_scale=8.0), saved) == LossScaleState(scale=4.0, good_steps=1)


@pytest.mark.parametrize("key", ["good_steps", "hysteresis_left"])
def test_a_state_dicts_counters_must_be_ints_and_the_error_names_the_key(key):
    saved = dict({"loss_scale": 4.0, "good_steps": 1, "hysteresis_left": 1}, **{key: 1.5})
    with pytest.raises(TypeError, match=rf"'state_dict\['{key}'\]' must be an int, but got 1.5"):
        state_from_dict(LossScalePolicy(init_scale=8.0, hysteresis=2), saved)


@pytest.mark.parametrize("value", [np.array([3, 4]), np.zeros((1, 2)), np.array([], np.float32)], ids=repr)
def test_a_state_value_is_one_number(value):
    with pytest.raises(TypeError, match=r"'good_steps' must be one number, but got an array of shape"):
        state_value("good_steps", value)
