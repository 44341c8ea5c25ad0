"""A ``GradScaler``'s rule and state in each framework's spelling (:mod:`lossscale.frontends.spelling`).

- :func:`framework_rule`: the rule a constructor's or setter's arguments make, errors in the caller's spelling;
- :func:`state_dict_of`: ``state_dict()`` in Paddle's or PyTorch's format;
- :func:`parse_state`: a saved state in either format (or lossscale's), checked, as ``(rule, state, dynamic)``.

A rule with hysteresis that works otherwise than the framework's (a preset such as Megatron's) adds its flags
to the state dict, so that a round trip keeps them; the frameworks' own ``load_state_dict`` ignore keys they do
not know.

Example:
    >>> rule = framework_rule({"growth_interval": 4}, PADDLE, get_preset("paddle"))
    >>> sorted(state_dict_of(PADDLE, LossScaleState(8.0, 1, 2), rule, True))[:3]
    ['decr_count', 'decr_every_n_nan_or_inf', 'decr_ratio']
"""

import numpy as np
from mindspore import Tensor

from lossscale.core._validation import AssertionValueError, check_bool, check_int_in_range
from lossscale.core.policy import LossScalePolicy, LossScaleState, build_policy, check_state
from lossscale.core.presets import PRESET_NAMES, get_preset
from lossscale.frontends.adaptive_rules import (
    ADAPTIVE_KEYS,
    changed_adaptive_rule,
    fixed_window_view,
    is_adaptive,
    parse_adaptive_state,
    window_state_dict,
)
from lossscale.frontends.spelling import PADDLE, TORCH

HYSTERESIS_FLAGS = ("consecutive_hysteresis", "refill_hysteresis_on_backoff")
# Ours, only for a rule with hysteresis (PyTorch's has none; PyTorch's load_state_dict ignores other keys).
TORCH_HYSTERESIS_KEYS = ("hysteresis", "_hysteresis_tracker") + HYSTERESIS_FLAGS


def hysteresis_flags(policy):
    """How ``policy``'s hysteresis works, as state-dict keys."""
    return {flag: getattr(policy, flag) for flag in HYSTERESIS_FLAGS}


PADDLE_HYSTERESIS = hysteresis_flags(get_preset("paddle"))


def framework_rule(fields, spelling, base, names=None):
    """``base`` (a LossScalePolicy) with ``fields`` replaced; errors name each field as ``names`` (default:
    ``spelling``'s names) spell it, and range errors are also ``AssertionError``s (PyTorch and Paddle assert on
    their factors). None is a ``TypeError``: the frameworks have no "derive it" value."""
    names = dict(spelling.fields, **(names or {}))
    for field, value in fields.items():
        if value is None:
            raise TypeError(f"'{names[field]}' must be a number, but got None.")
    if is_adaptive(base):
        return changed_adaptive_rule(fields, names, base)
    try:
        return build_policy(names, **dict(vars(base), **fields))
    except ValueError as error:
        raise AssertionValueError(str(error)) from None


def as_policy(policy):
    """A LossScalePolicy or AdaptiveWindowRule from ``policy`` (one of them or a preset name)."""
    if isinstance(policy, str):
        try:
            return get_preset(policy)
        except ValueError as error:
            raise ValueError(str(error).replace("'preset'", "'policy'")) from None
    if not isinstance(policy, LossScalePolicy) and not is_adaptive(policy):
        raise TypeError(
            f"'policy' must be a LossScalePolicy, an AdaptiveWindowRule or a preset name in {PRESET_NAMES}, but got "
            f"{type(policy).__name__}."
        )
    return policy


def state_dict_of(spelling, state, policy, dynamic):
    """``state`` (a LossScaleState of ``policy``) as ``spelling``'s ``state_dict()``: Paddle's ``scale`` is a float32
    array of shape (1,) beside ``incr_count``, ``decr_count`` and ``use_dynamic_loss_scaling``; PyTorch's a float
    beside ``_growth_tracker``. An adaptive window rule's state adds its window state
    (:mod:`lossscale.frontends.adaptive_rules`)."""
    if is_adaptive(policy):
        window_state, window_rule = fixed_window_view(state, policy)
        return dict(state_dict_of(spelling, window_state, window_rule, True), **window_state_dict(state, policy))
    if spelling is PADDLE:
        saved = {
            "scale": np.array([state.scale], np.float32),
            "incr_ratio": policy.growth_factor,
            "decr_ratio": policy.backoff_factor,
            "incr_every_n_steps": policy.growth_interval,
            "decr_every_n_nan_or_inf": policy.hysteresis,
            "incr_count": state.good_steps,
            "decr_count": policy.hysteresis - state.hysteresis_left,
            "use_dynamic_loss_scaling": dynamic,
        }
        if policy.hysteresis != 1 and hysteresis_flags(policy) != PADDLE_HYSTERESIS:
            saved.update(hysteresis_flags(policy))
        return saved
    saved = {
        "scale": state.scale,
        "growth_factor": policy.growth_factor,
        "backoff_factor": policy.backoff_factor,
        "growth_interval": policy.growth_interval,
        "_growth_tracker": state.good_steps,
    }
    if policy.hysteresis != 1:
        saved.update(
            hysteresis=policy.hysteresis,
            _hysteresis_tracker=policy.hysteresis - state.hysteresis_left,
            **hysteresis_flags(policy),
        )
    return saved


def _number(state_dict, key):
    """``state_dict[key]`` as a Python number (a one-element array or Tensor is unwrapped)."""
    value = state_dict[key]
    if isinstance(value, Tensor):
        value = value.asnumpy()
    if isinstance(value, (np.ndarray, list, tuple)):
        array = np.asarray(value)
        if array.size != 1:
            raise ValueError(f"'state_dict[{key!r}]' must hold one number, but got {array.size} values.")
        value = array.reshape(-1)[0].item()
    if isinstance(value, np.generic):
        value = value.item()
    return value


def _saved_spelling(state_dict):
    """The spelling whose format ``state_dict`` has, and the keys it must hold."""
    if "incr_ratio" in state_dict:
        extra = HYSTERESIS_FLAGS if any(key in state_dict for key in HYSTERESIS_FLAGS) else ()
        return PADDLE, PADDLE.state_keys + extra
    if "growth_factor" in state_dict:
        extra = TORCH_HYSTERESIS_KEYS if any(key in state_dict for key in TORCH_HYSTERESIS_KEYS) else ()
        return TORCH, TORCH.state_keys + extra
    raise ValueError(
        f"'state_dict' is neither a Paddle GradScaler state (keys {list(PADDLE.state_keys)}) nor a "
        f"PyTorch one (keys {list(TORCH.state_keys)}); got keys {sorted(state_dict)}."
    )


def parse_state(state_dict, current):
    """``(policy, state, dynamic)`` from a Paddle-format or PyTorch-format state dict, fully validated against the
    scaler's ``current`` rule (whose hysteresis works one way, fixed when it is built; an adaptive rule's factor
    and levels are fixed too)."""
    spelling, keys = _saved_spelling(state_dict)
    if is_adaptive(current) or "list_index" in state_dict:
        keys = _adaptive_keys(state_dict, current, keys)
    missing = [key for key in keys if key not in state_dict]
    if missing:
        raise ValueError(
            f"'state_dict' is missing {missing}; a {spelling.framework} GradScaler state has the keys {list(keys)}."
        )
    values = {key: _number(state_dict, key) for key in keys}
    if is_adaptive(current):
        return (*parse_adaptive_state(spelling, values, current), True)
    rule = {field: values[spelling.name_of(field)] for field in ("growth_factor", "backoff_factor", "growth_interval")}
    rule["init_scale"] = values["scale"]
    if spelling.name_of("hysteresis") in values:
        rule["hysteresis"] = values[spelling.name_of("hysteresis")]
        rule.update(_loaded_hysteresis_flags(values, rule["hysteresis"], current))
    policy = framework_rule(rule, spelling, current, {"init_scale": "state_dict['scale']"})
    good_key, bad_key = spelling.counter_keys
    good = check_int_in_range(f"state_dict[{good_key!r}]", values[good_key], low=0, high=policy.growth_interval - 1)
    bad = check_int_in_range(f"state_dict[{bad_key!r}]", values.get(bad_key, 0), low=0, high=policy.hysteresis - 1)
    dynamic = (
        True
        if spelling is TORCH
        else check_bool("state_dict['use_dynamic_loss_scaling']", values["use_dynamic_loss_scaling"])
    )
    state = LossScaleState(scale=policy.init_scale, good_steps=good, hysteresis_left=policy.hysteresis - bad)
    return policy, check_state(policy, state), dynamic


def _adaptive_keys(state_dict, current, keys):
    """The keys a state for (or from) an adaptive window rule must hold; ``ValueError`` if only one of the saved state
    and the ``current`` rule is adaptive: each is built for its own update graph."""
    if not is_adaptive(current):
        raise ValueError(
            "'state_dict' holds MindFormers' adaptive window state ('list_index', ...), but this scaler's rule has a "
            "fixed window: load it into a scaler built with its rule (policy=AdaptiveWindowRule(...), or "
            "from_preset('mindformers'))."
        )
    if "list_index" not in state_dict:
        raise ValueError(
            f"this scaler's rule is MindFormers' adaptive window, but 'state_dict' holds a fixed-window state (no "
            f"{list(ADAPTIVE_KEYS)}): load it into a scaler built with a fixed-window rule."
        )
    return tuple(key for key in keys if key not in HYSTERESIS_FLAGS + TORCH_HYSTERESIS_KEYS) + ADAPTIVE_KEYS


def _loaded_hysteresis_flags(values, hysteresis, current):
    """How a loaded state's hysteresis works: as its dict says; else (a Paddle state) as the ``current`` rule
    does, unless that rule has no hysteresis, whose flags mean nothing: then as Paddle's. ValueError if that
    is not how ``current``'s works: the update graphs are built for one way (and a hybrid would be no
    library's rule)."""
    if HYSTERESIS_FLAGS[0] in values:
        flags = {flag: check_bool(f"state_dict[{flag!r}]", values[flag]) for flag in HYSTERESIS_FLAGS}
    elif hysteresis != 1 and current.hysteresis == 1:
        flags = PADDLE_HYSTERESIS
    else:
        flags = hysteresis_flags(current)
    if flags != hysteresis_flags(current):
        raise ValueError(
            f"'state_dict' holds a rule with hysteresis {hysteresis} working as {flags}, but this "
            f"scaler's hysteresis works as {hysteresis_flags(current)}, which is fixed when it is "
            f"built: load it into a scaler built with that rule (Paddle's spelling, "
            f"GradScaler(init_loss_scaling=...), for a Paddle state; policy=... for another)."
        )
    return flags
