"""The dynamic loss-scale update rule as a pure, framework-free reference.

This module is the specification: the graph cells in :mod:`lossscale.core.update_cells`
and the host-side managers in :mod:`lossscale.training.managers` are tested against
:func:`update`. It imports NumPy only, for float32 arithmetic, because the device
keeps the scale in a float32 Parameter and the reference must round exactly as
the device does.

Algorithm (one call of :func:`update` per training step)::

    if overflow:                                   # any gradient inf/nan: the step is skipped
        good_steps = 0                             # an overflow restarts the growth window
        if hysteresis_left > 1:
            hysteresis_left -= 1                   # absorbed by the hysteresis
        else:                                      # the N-th overflow (hysteresis N) backs off
            scale = max(scale * backoff_factor, min_scale)   # 0 if below 2**-126 (no subnormal scales)
            hysteresis_left = hysteresis if refill_hysteresis_on_backoff else 1
    else:
        good_steps += 1
        if consecutive_hysteresis:                 # any clean step forgives earlier overflows
            hysteresis_left = hysteresis
        if good_steps == growth_interval:          # the W-th consecutive clean step grows
            good_steps = 0
            hysteresis_left = hysteresis           # default mode: refilled on growth
            grown = scale * growth_factor
            if isfinite(grown):                    # never grow to inf (float32)
                scale = min(grown, max_scale)

With the defaults (``hysteresis=1``, ``min_scale=1``, ``max_scale=None``) this is
exactly MindSpore's ``DynamicLossScaleUpdateCell``, except that MindSpore lets the
scale grow to inf. All arithmetic is float32, like the device's.

Example:
    >>> policy = LossScalePolicy(init_scale=8.0, growth_factor=2.0, growth_interval=2)
    >>> [s.scale for s in run(policy, [False, False, True, True, False])]
    [8.0, 16.0, 8.0, 4.0, 4.0]
"""

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Iterable, List, Optional

import numpy as np

from lossscale.core._validation import (
    FLOAT32_MAX,
    check_bool,
    check_finite_in_range,
    check_int_in_range,
    refuse_float32_degenerate,
)

_F32 = np.float32


def _f32(value):
    """Round a Python number to the nearest float32 and return it as a Python float."""
    return float(_F32(value))


@dataclass(frozen=True)
class LossScalePolicy:
    """An immutable description of a dynamic loss-scale update rule.

    Args:
        init_scale: the first scale, finite, in ``[min_scale, max_scale]``.
        growth_factor: multiplier applied on growth, finite and > 1.
        backoff_factor: multiplier applied on backoff, in ``(0, 1)``. ``None`` means
            ``1 / growth_factor`` rounded to float32 (MindSpore's ``reciprocal``).
        growth_interval: consecutive clean steps that trigger a growth (``scale_window``).
        hysteresis: the scale backs off on the ``hysteresis``-th overflow only.
        consecutive_hysteresis: if True any clean step refills the hysteresis,
            otherwise only a growth does.
        refill_hysteresis_on_backoff: if True a backoff also refills the hysteresis,
            so every ``hysteresis``-th overflow backs off (Paddle's
            ``decr_every_n_nan_or_inf``); if False (DeepSpeed, Megatron-LM) every
            overflow after the first backoff backs off until the next refill.
        min_scale: floor of the scale; 0 means no floor (PyTorch's behaviour).
        max_scale: ceiling of the scale; ``None`` means the largest finite float32.

    Raises:
        TypeError, ValueError: naming the argument, the value and the allowed range.

    Example:
        >>> LossScalePolicy(init_scale=2**16, growth_interval=1000).backoff_factor
        0.5
    """

    init_scale: float = 2.0**24
    growth_factor: float = 2.0
    backoff_factor: Optional[float] = None
    growth_interval: int = 2000
    hysteresis: int = 1
    consecutive_hysteresis: bool = False
    refill_hysteresis_on_backoff: bool = False
    min_scale: float = 1.0
    max_scale: Optional[float] = None

    def __post_init__(self):
        def set_field(name, value):
            object.__setattr__(self, name, value)

        growth = check_finite_in_range("growth_factor", self.growth_factor, low=1.0, low_inclusive=False)
        refuse_float32_degenerate("growth_factor", growth, _f32(growth) <= 1.0, "rounds to 1.0")
        set_field("growth_factor", growth)
        backoff = self.backoff_factor
        if backoff is None:
            backoff = float(_F32(1.0) / _F32(growth))
        backoff = check_finite_in_range(
            "backoff_factor", backoff, low=0.0, high=1.0, low_inclusive=False, high_inclusive=False
        )
        refuse_float32_degenerate("backoff_factor", backoff, not 0.0 < _f32(backoff) < 1.0, "rounds to 0.0 or 1.0")
        set_field("backoff_factor", backoff)
        set_field("growth_interval", check_int_in_range("growth_interval", self.growth_interval, low=1))
        set_field("hysteresis", check_int_in_range("hysteresis", self.hysteresis, low=1))
        check_bool("consecutive_hysteresis", self.consecutive_hysteresis)
        check_bool("refill_hysteresis_on_backoff", self.refill_hysteresis_on_backoff)
        min_scale = check_finite_in_range("min_scale", self.min_scale, low=0.0)
        set_field("min_scale", min_scale)
        # A scale must be positive: with no floor (min_scale == 0) the lower bound is exclusive.
        floor = dict(low=min_scale, low_inclusive=min_scale > 0)
        max_scale = FLOAT32_MAX if self.max_scale is None else self.max_scale
        max_scale = check_finite_in_range("max_scale", max_scale, **floor)
        set_field("max_scale", None if self.max_scale is None else max_scale)
        init = check_finite_in_range("init_scale", self.init_scale, high=max_scale, **floor)
        with np.errstate(divide="ignore", over="ignore"):
            degenerate = not (_f32(init) > 0 and np.isfinite(_F32(1.0) / _F32(init)))
        refuse_float32_degenerate("init_scale", init, degenerate, "is 0 or has an infinite reciprocal")
        set_field("init_scale", init)

    @property
    def floor(self):
        """The effective minimum scale as a float32 value (``min_scale`` rounded as the device holds it).

        Example:
            >>> LossScalePolicy(min_scale=0.7).floor < 0.7
            True
        """
        return _f32(self.min_scale)

    @property
    def ceiling(self):
        """The effective maximum scale as a float32 value (``max_scale`` or FLOAT32_MAX)."""
        return _f32(FLOAT32_MAX if self.max_scale is None else self.max_scale)


@dataclass(frozen=True)
class LossScaleState:
    """The mutable part of dynamic loss scaling, as an immutable value.

    Attributes:
        scale: the current scale (a float32 value).
        good_steps: consecutive clean steps since the last overflow or growth,
            always in ``[0, growth_interval)``, so it never overflows int32.
        hysteresis_left: overflows that still must happen before the next backoff,
            counting the one that backs off; in ``[1, hysteresis]``.

    Example:
        >>> policy = LossScalePolicy(init_scale=64.0, hysteresis=2)
        >>> update(policy, LossScaleState(scale=64.0, hysteresis_left=2), overflow=True)
        LossScaleState(scale=64.0, good_steps=0, hysteresis_left=1)
    """

    scale: float
    good_steps: int = 0
    hysteresis_left: int = 1


_MINDSPORE_NAMES = {
    "growth_factor": "scale_factor",
    "growth_interval": "scale_window",
    "min_scale": "min_loss_scale",
    "max_scale": "max_loss_scale",
}


def build_policy(names, **fields):
    """``LossScalePolicy(**fields)``, with errors naming each field as the caller spells it.

    ``names`` maps policy field names to the caller's argument names (e.g. Paddle's
    ``{"growth_factor": "incr_ratio"}``).

    Example:
        >>> try:
        ...     build_policy({"growth_factor": "incr_ratio"}, growth_factor=0.5)
        ... except ValueError as error:
        ...     print(str(error).split(" must")[0])
        'incr_ratio'
    """
    try:
        return LossScalePolicy(**fields)
    except (TypeError, ValueError) as error:
        message = str(error)
        for field, name in names.items():
            message = message.replace(f"'{field}'", f"'{name}'")
        raise type(error)(message) from None


def policy_from_mindspore_arguments(init_name, init_scale, scale_factor, scale_window, **extensions):
    """Build a :class:`LossScalePolicy` from MindSpore-style arguments.

    Errors name the argument as the caller spelled it (``init_name`` for the
    initial scale, ``scale_factor``, ``scale_window``, ``min_loss_scale``, ...).

    Example:
        >>> policy_from_mindspore_arguments("init_loss_scale", 1024, 2, 100, min_loss_scale=4.0).min_scale
        4.0
    """
    return build_policy(
        dict(_MINDSPORE_NAMES, init_scale=init_name),
        init_scale=init_scale,
        growth_factor=scale_factor,
        growth_interval=scale_window,
        backoff_factor=extensions.get("backoff_factor"),
        hysteresis=extensions.get("hysteresis", 1),
        consecutive_hysteresis=extensions.get("consecutive_hysteresis", False),
        refill_hysteresis_on_backoff=extensions.get("refill_hysteresis_on_backoff", False),
        min_scale=extensions.get("min_loss_scale", 1.0),
        max_scale=extensions.get("max_loss_scale"),
    )


def policy_extensions(policy):
    """The keyword extensions (MindSpore spelling) that rebuild ``policy`` with
    :func:`policy_from_mindspore_arguments`: everything except the initial scale, factor and window.

    Example:
        >>> policy_extensions(LossScalePolicy(hysteresis=2))["hysteresis"]
        2
    """
    return {
        "backoff_factor": policy.backoff_factor,
        "hysteresis": policy.hysteresis,
        "consecutive_hysteresis": policy.consecutive_hysteresis,
        "refill_hysteresis_on_backoff": policy.refill_hysteresis_on_backoff,
        "min_loss_scale": policy.min_scale,
        "max_loss_scale": policy.max_scale,
    }


def check_state(
    policy: LossScalePolicy, state: LossScaleState, names=("state.scale", "state.good_steps", "state.hysteresis_left")
) -> LossScaleState:
    """Return ``state`` if it is reachable under ``policy``; raise ``ValueError`` naming the bad field
    (as ``names`` spells the three fields).

    Example:
        >>> check_state(LossScalePolicy(growth_interval=4), LossScaleState(scale=8.0, good_steps=3))
        LossScaleState(scale=8.0, good_steps=3, hysteresis_left=1)
    """
    if not isinstance(policy, LossScalePolicy):
        raise TypeError(f"'policy' must be a LossScalePolicy, but got {type(policy).__name__}.")
    if not isinstance(state, LossScaleState):
        raise TypeError(
            f"'state' must be a LossScaleState (state_from_dict reads a state dict), but got {type(state).__name__}."
        )
    check_finite_in_range(names[0], state.scale, low=policy.floor, high=policy.ceiling)
    check_int_in_range(names[1], state.good_steps, low=0, high=policy.growth_interval - 1)
    check_int_in_range(names[2], state.hysteresis_left, low=1, high=policy.hysteresis)
    return state


STATE_KEYS = ("loss_scale", "good_steps", "hysteresis_left")


def state_value(name, value):
    """One number of a state dict as a Python int or float: a number, a NumPy scalar or a one-element
    array or Tensor (anything with ``asnumpy``); ``TypeError`` naming ``name`` otherwise (bools included).

    Example:
        >>> state_value("state_dict['good_steps']", np.array([3], np.int32))
        3
    """
    if hasattr(value, "asnumpy"):
        value = value.asnumpy()
    if isinstance(value, np.ndarray):
        if value.size != 1:
            raise TypeError(f"'{name}' must be one number, but got an array of shape {value.shape}.")
        value = value.reshape(-1)[0]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"'{name}' must be a number, but got {value!r} of type {type(value).__name__}.")
    return value


def state_from_dict(policy: LossScalePolicy, state_dict, owner="state_dict") -> LossScaleState:
    """The :class:`LossScaleState` of a ``{'loss_scale', 'good_steps', 'hysteresis_left'}`` dict (what
    ``state_dict()`` returns), validated against ``policy``; every error names the key.

    Example:
        >>> state_from_dict(LossScalePolicy(init_scale=8.0), {"loss_scale": 4.0, "good_steps": 2, "hysteresis_left": 1})
        LossScaleState(scale=4.0, good_steps=2, hysteresis_left=1)
    """
    names = tuple(f"{owner}[{key!r}]" for key in STATE_KEYS)
    values = state_dict_values(state_dict, STATE_KEYS, owner)
    if not isinstance(values["good_steps"], int) or not isinstance(values["hysteresis_left"], int):
        bad = "good_steps" if not isinstance(values["good_steps"], int) else "hysteresis_left"
        raise TypeError(f"'{owner}[{bad!r}]' must be an int, but got {values[bad]!r}.")
    state = LossScaleState(
        scale=float(values["loss_scale"]), good_steps=values["good_steps"], hysteresis_left=values["hysteresis_left"]
    )
    return check_state(policy, state, names)


def state_dict_values(state_dict, keys, owner="state_dict"):
    """``{key: number}`` for ``keys`` of a state dict: ``TypeError`` if it is not a dict, ``ValueError``
    naming the missing keys, and :func:`state_value` for each value."""
    if not isinstance(state_dict, Mapping):
        raise TypeError(f"'{owner}' must be a dict, but got {type(state_dict).__name__}.")
    missing = [key for key in keys if key not in state_dict]
    if missing:
        raise ValueError(
            f"'{owner}' is missing {missing}; a saved state has the keys {list(keys)}, but got "
            f"{sorted(map(str, state_dict))}."
        )
    return {key: state_value(f"{owner}[{key!r}]", state_dict[key]) for key in keys}


def initial_state(policy: LossScalePolicy) -> LossScaleState:
    """The state before the first step: ``init_scale`` rounded to float32, full hysteresis.

    Example:
        >>> initial_state(LossScalePolicy(init_scale=1024.0, hysteresis=2))
        LossScaleState(scale=1024.0, good_steps=0, hysteresis_left=2)
    """
    return LossScaleState(scale=_f32(policy.init_scale), good_steps=0, hysteresis_left=policy.hysteresis)


def grown_scale(policy: LossScalePolicy, scale: float) -> float:
    """``scale * growth_factor`` in float32, capped at the ceiling; unchanged if that is not finite."""
    with np.errstate(over="ignore"):
        candidate = _F32(scale) * _F32(policy.growth_factor)
    if not np.isfinite(candidate):
        return _f32(scale)
    return float(min(candidate, _F32(policy.ceiling)))


FLOAT32_TINY = float(np.finfo(np.float32).tiny)  # the smallest normal float32, 2**-126


def backed_off_scale(policy: LossScalePolicy, scale: float) -> float:
    """``scale * backoff_factor`` in float32, floored at ``min_scale``; a result below the smallest normal
    float32 is 0. (CPU kernels may flush such subnormal results to zero or not, depending on the thread's
    floating-point mode, so the rule flushes them always and the device agrees with it.)"""
    backed_off = float(max(_F32(scale) * _F32(policy.backoff_factor), _F32(policy.floor)))
    return 0.0 if backed_off < FLOAT32_TINY else backed_off


def update(policy: LossScalePolicy, state: LossScaleState, overflow: bool) -> LossScaleState:
    """Return the state after one step whose gradients did (``overflow=True``) or did not overflow.

    Pure: neither argument is changed. See the module docstring for the algorithm.

    Example:
        >>> p = LossScalePolicy(init_scale=4.0, growth_interval=1)
        >>> update(p, initial_state(p), overflow=False).scale
        8.0
    """
    _check_update_arguments(policy, state, overflow)
    if overflow:
        if state.hysteresis_left > 1:
            return LossScaleState(scale=state.scale, good_steps=0, hysteresis_left=state.hysteresis_left - 1)
        left = policy.hysteresis if policy.refill_hysteresis_on_backoff else 1
        return LossScaleState(scale=backed_off_scale(policy, state.scale), good_steps=0, hysteresis_left=left)
    good_steps = state.good_steps + 1
    hysteresis_left = policy.hysteresis if policy.consecutive_hysteresis else state.hysteresis_left
    if good_steps >= policy.growth_interval:
        return LossScaleState(scale=grown_scale(policy, state.scale), good_steps=0, hysteresis_left=policy.hysteresis)
    return replace(state, good_steps=good_steps, hysteresis_left=hysteresis_left)


def _check_update_arguments(policy, state, overflow):
    """TypeError unless ``overflow`` is a bool (a NumPy bool is one), then :func:`check_state`: the rule would
    otherwise run on a flag such as ``"no"`` (truthy) or a state no cell can hold."""
    if not isinstance(overflow, (bool, np.bool_)):
        raise TypeError(f"'overflow' must be a bool, but got {overflow!r} of type {type(overflow).__name__}.")
    check_state(policy, state)


def run(
    policy: LossScalePolicy, overflows: Iterable[bool], state: Optional[LossScaleState] = None
) -> List[LossScaleState]:
    """Apply :func:`update` for each overflow flag; return the state after every step.

    Example:
        >>> [s.scale for s in run(LossScalePolicy(init_scale=2.0, growth_interval=3), [True, True])]
        [1.0, 1.0]
    """
    state = initial_state(policy) if state is None else state
    trajectory = []
    for overflow in overflows:
        state = update(policy, state, overflow)
        trajectory.append(state)
    return trajectory
