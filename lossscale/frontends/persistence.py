"""A front-end's rule and state in its framework's spelling (:mod:`lossscale.frontends.spelling`), for any rule.

The framework's keys hold what the rule's view says (:meth:`lossscale.core.rule.LossScaleRule.view`); the rule's
extras (a hysteresis mode, a window state) are added under their own keys, except those the framework's own state
dicts imply. A rule without a view saves its own state (``loss_scale`` and its counters). Loading takes either
framework's format, checked against the scaler's rule, which builds the loaded rule and state (``from_view``).

Example:
    >>> from lossscale.core.presets import get_preset
    >>> rule = get_preset("paddle", growth_interval=4)
    >>> sorted(state_dict_of(PADDLE, rule, rule.initial_state(), True))[:3]
    ['decr_count', 'decr_every_n_nan_or_inf', 'decr_ratio']
"""

import numpy as np
from mindspore import Tensor

from lossscale.core._validation import check_bool
from lossscale.core.presets import PRESET_NAMES, get_preset
from lossscale.core.rule import LossScaleRule, from_state_dict, host_view, to_state_dict
from lossscale.frontends.spelling import PADDLE, TORCH

_VIEW_FIELDS = ("growth_factor", "backoff_factor", "growth_interval")


def as_rule(policy, argument="policy"):
    """A rule from ``policy``: a :class:`LossScaleRule` or a preset's name; ``TypeError``/``ValueError`` naming
    ``argument`` otherwise."""
    if isinstance(policy, str):
        try:
            return get_preset(policy)
        except ValueError as error:
            raise ValueError(str(error).replace("'preset'", f"'{argument}'")) from None
    if not isinstance(policy, LossScaleRule):
        raise TypeError(
            f"'{argument}' must be a loss-scale rule (LossScalePolicy, AdaptiveWindowRule, your own LossScaleRule) or "
            f"a preset name in {PRESET_NAMES}, but got {type(policy).__name__}."
        )
    return policy


def framework_rule(fields, spelling, base, names=None):
    """``base`` with the view's ``fields`` changed (``base.changed``); errors name each field as ``names`` (default:
    ``spelling``'s names) spell it."""
    return base.changed(fields, dict(spelling.fields, **(names or {})))


def state_dict_of(spelling, rule, state, dynamic):
    """``state`` (of ``rule``) as ``spelling``'s state dict: Paddle's scale a float32 array of shape (1,) beside its
    counters and ``use_dynamic_loss_scaling``; PyTorch's a float beside ``_growth_tracker``."""
    view = host_view(rule, state)
    if view is None:
        return to_state_dict(rule, state)
    saved = {"scale": np.array([view["scale"]], np.float32) if spelling.scale_as_array else view["scale"]}
    saved.update({spelling.name_of(field): view[field] for field in _VIEW_FIELDS})
    good_key, bad_key = spelling.counter_keys
    saved[good_key] = view["good_steps"]
    if spelling.hysteresis_saved or view["hysteresis"] != 1:
        saved.update({spelling.name_of("hysteresis"): view["hysteresis"], bad_key: view["bad_steps"]})
    if not spelling.always_dynamic:
        saved["use_dynamic_loss_scaling"] = dynamic
    extras = rule.extras(state)
    saved.update({key: value for key, value in extras.items() if spelling.implied.get(key) != value})
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
    return value.item() if isinstance(value, np.generic) else value


def saved_spelling(state_dict):
    """The spelling whose format ``state_dict`` has."""
    if "incr_ratio" in state_dict:
        return PADDLE
    if "growth_factor" in state_dict:
        return TORCH
    raise ValueError(
        f"'state_dict' is neither a Paddle GradScaler state (keys {list(PADDLE.state_keys)}) nor a PyTorch one (keys "
        f"{list(TORCH.state_keys)}); got keys {sorted(state_dict)}."
    )


def parse_state(state_dict, rule):
    """``(rule, state, dynamic)`` from a state dict of either framework's format (or a rule's own, for a rule without
    a view), checked against the scaler's ``rule``; nothing is changed here."""
    if host_view(rule, rule.initial_state()) is None:
        return rule, from_state_dict(rule, state_dict), True
    spelling = saved_spelling(state_dict)
    keys = {field: spelling.name_of(field) for field in ("scale", *_VIEW_FIELDS, "hysteresis")}
    keys.update(good_steps=spelling.counter_keys[0], bad_steps=spelling.counter_keys[1])
    missing = [key for key in spelling.state_keys if key not in state_dict]
    if missing:
        raise ValueError(
            f"'state_dict' is missing {missing}; a {spelling.framework} GradScaler state has the keys "
            f"{list(spelling.state_keys)}."
        )
    extras = rule.extras(rule.initial_state())
    known = {*keys.values(), *extras, *spelling.ignored, "use_dynamic_loss_scaling"}
    unknown = sorted(set(state_dict) - known)
    if unknown:
        raise ValueError(
            f"'state_dict' holds {unknown}, which this scaler's rule ({type(rule).__name__}) does not know: it was "
            f"saved by a scaler with another rule. Load it into a scaler built with that rule."
        )
    values = {field: _number(state_dict, key) for field, key in keys.items() if key in state_dict}
    values.update({key: _number(state_dict, key) for key in extras if key in state_dict})
    names = {field: f"state_dict[{key!r}]" for field, key in dict(keys, **{key: key for key in extras}).items()}
    names["init_scale"] = names["scale"]
    rule, state = rule.from_view(values, names, spelling.implied)
    dynamic = state_dict.get("use_dynamic_loss_scaling", True)
    return rule, state, check_bool("state_dict['use_dynamic_loss_scaling']", _number({"d": dynamic}, "d"))
