"""A ``GradScaler`` holding MindFormers' adaptive window rule (:mod:`lossscale.core.adaptive`): its state dict in
each framework's format, that state read back, and what its setters may change.

The framework's keys keep their meaning: ``scale``; the factors (the back-off is ``1 / scale_factor``); the
*current* window as ``growth_interval`` (Paddle's ``incr_every_n_steps``) and the steps since the last growth or
overflow as ``_growth_tracker`` (``incr_count``); Paddle's ``decr_every_n_nan_or_inf`` is 1 and ``decr_count`` 0.
The window state adds :data:`ADAPTIVE_KEYS`, MindFormers' names. A state loads only into a scaler with the same
factor and window levels (constants of its update graph); its scale also becomes the initial scale, as both
frameworks do.

Example:
    >>> from lossscale.core.presets import get_preset
    >>> rule = get_preset("mindformers")
    >>> state, view = fixed_window_view(rule.initial_state(), rule)
    >>> view.growth_interval, state.good_steps, window_state_dict(rule.initial_state(), rule)["list_index"]
    (20, 0, 0)
"""

import dataclasses

from lossscale.core._validation import FLOAT32_MAX, check_finite_in_range, check_int_in_range
from lossscale.core.adaptive import HIDDEN, AdaptiveState, AdaptiveWindowRule
from lossscale.core.adaptive_cell import check_adaptive_state
from lossscale.core.policy import LossScalePolicy, LossScaleState
from lossscale.frontends.spelling import PADDLE

# MindFormers' names of the window state (its Parameters' and lossscale's cell state dict's).
ADAPTIVE_KEYS = ("max_scale_window", "min_scale_window", "list_index", "window_up_count", "window_down_count")


def is_adaptive(rule):
    """Whether ``rule`` is MindFormers' adaptive window rule."""
    return isinstance(rule, AdaptiveWindowRule)


def fixed_window_view(state, rule):
    """``(LossScaleState, LossScalePolicy)``: ``state`` of ``rule`` seen as a fixed-window rule now, whose window is
    the current one; what the framework's own keys of a state dict hold."""
    view = LossScalePolicy(
        init_scale=state.scale,
        growth_factor=rule.growth_factor,
        backoff_factor=rule.backoff_factor,
        growth_interval=state.growth_interval,
    )
    return LossScaleState(state.scale, state.good_steps), view


def window_state_dict(state, rule):
    """The :data:`ADAPTIVE_KEYS` of ``state`` (an AdaptiveState of ``rule``)."""
    return dict(
        max_scale_window=rule.max_scale_window,
        min_scale_window=rule.min_scale_window,
        list_index=state.level,
        window_up_count=state.ups,
        window_down_count=state.downs,
    )


def _refuse_other_rule(spelling, values, current):
    """``ValueError`` naming the key unless the saved factors and window bounds are ``current``'s (fixed when a
    scaler is built)."""
    expected = {
        spelling.name_of("growth_factor"): current.growth_factor,
        spelling.name_of("backoff_factor"): current.backoff_factor,
        "max_scale_window": current.max_scale_window,
        "min_scale_window": current.min_scale_window,
    }
    if spelling is PADDLE:
        expected.update(decr_every_n_nan_or_inf=1, decr_count=0, use_dynamic_loss_scaling=True)
    for key, value in expected.items():
        if values[key] != value:
            raise ValueError(
                f"'state_dict[{key!r}]' is {values[key]!r}, but this scaler's adaptive window rule has {value!r} "
                f"(its factor and window levels are fixed when it is built): load it into a scaler built with "
                f"the rule that saved it."
            )


def parse_adaptive_state(spelling, values, current):
    """``(rule, state)`` from a saved state's ``values`` (the base keys and :data:`ADAPTIVE_KEYS`, as numbers),
    validated against the scaler's ``current`` AdaptiveWindowRule; errors name the key."""
    _refuse_other_rule(spelling, values, current)
    scale = check_finite_in_range("state_dict['scale']", values["scale"], low=1.0, high=FLOAT32_MAX)
    level = check_int_in_range(
        "state_dict['list_index']", values["list_index"], low=HIDDEN, high=len(current.levels) - 1
    )
    start = AdaptiveState(float(scale), current.window_of(level), level)
    window_key, window = spelling.name_of("growth_interval"), start.growth_interval
    if values[window_key] != window:
        raise ValueError(
            f"'state_dict[{window_key!r}]' must be the window of level {level} (state_dict['list_index']), "
            f"{window}, but got {values[window_key]!r}."
        )
    tracker = spelling.counter_keys[0]
    good = check_int_in_range(f"state_dict[{tracker!r}]", values[tracker], low=0, high=window - 1)
    counters = [values[key] for key in ("window_up_count", "window_down_count")]
    state = dataclasses.replace(start, ups=counters[0], downs=counters[1], step=good + 1, last_step=0)
    return dataclasses.replace(current, init_scale=float(scale)), check_adaptive_state(current, state)


def changed_adaptive_rule(fields, names, base):
    """``base`` with a new initial scale, the one number of an adaptive rule a setter may change; ``ValueError``
    naming the field (as ``names`` spell it) for any other."""
    for field in fields:
        if field != "init_scale":
            raise ValueError(
                f"'{names[field]}' cannot change in MindFormers' adaptive window rule (its factor and window "
                f"levels are constants of the update graph): build a GradScaler with another AdaptiveWindowRule."
            )
    value = check_finite_in_range(names["init_scale"], fields["init_scale"], low=1.0, high=FLOAT32_MAX)
    return dataclasses.replace(base, init_scale=float(value))
