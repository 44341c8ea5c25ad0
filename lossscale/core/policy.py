"""The dynamic loss-scale rule with hysteresis and bounds, one :class:`LossScalePolicy` (docs/design.md, section 1).

Per step: an overflow restarts the growth window and, on the ``hysteresis``-th overflow, multiplies the scale by
``backoff_factor`` (floored at ``min_scale``; below the smallest normal float32 it is 0); the ``growth_interval``-th
consecutive clean step multiplies it by ``growth_factor`` (capped at ``max_scale``, never to inf). With the
defaults this is MindSpore's ``DynamicLossScaleUpdateCell``; its presets are PyTorch's, Paddle's, Keras', ...

Example:
    >>> policy = LossScalePolicy(init_scale=8.0, growth_factor=2.0, growth_interval=2)
    >>> [s.scale for s in run(policy, [False, False, True, True, False])]
    [8.0, 16.0, 8.0, 4.0, 4.0]
"""

import dataclasses
from dataclasses import dataclass
from typing import Optional

import numpy as np

from lossscale.core._validation import (
    FLOAT32_MAX,
    FLOAT32_TINY,
    AssertionValueError,
    check_bool,
    check_finite_in_range,
    check_int_in_range,
    read_only,
    refuse_float32_degenerate,
)
from lossscale.core.rule import (
    LossScaleRule,
    StateField,
    advance,
    as_mapping,
    from_state_dict,
    host_or_graph,
    isfinite,
    maximum,
    minimum,
    state_dict_values,  # noqa: F401 (the state-dict readers, where they have always been)
    state_names,
    state_value,  # noqa: F401
    where,
)
from lossscale.core.rule import run as _run
from lossscale.core.spelling import MINDSPORE_CELL, errors_named, rule_fields
from lossscale.core.update_cells import LossScaleUpdateCell, refuse_immutable

_F32 = np.float32
_FLAGS = ("consecutive_hysteresis", "refill_hysteresis_on_backoff")


def _f32(value):
    """A Python number rounded to the nearest float32, as a Python float."""
    return float(_F32(value))


@dataclass(frozen=True)
class LossScaleState:
    """The rule's state: the ``scale`` (float32), ``good_steps`` (clean steps since the last overflow or growth, in
    ``[0, growth_interval)``) and ``hysteresis_left`` (overflows until the next backoff, in ``[1, hysteresis]``).

    Example:
        >>> policy = LossScalePolicy(init_scale=64.0, hysteresis=2)
        >>> update(policy, LossScaleState(scale=64.0, hysteresis_left=2), overflow=True)
        LossScaleState(scale=64.0, good_steps=0, hysteresis_left=1)
    """

    scale: float
    good_steps: int = 0
    hysteresis_left: int = 1


@dataclass(frozen=True)
class LossScalePolicy(LossScaleRule):
    """An immutable dynamic loss-scale rule.

    Args:
        init_scale: the first scale, finite, in ``[min_scale, max_scale]``.
        growth_factor: multiplier applied on growth, finite and > 1.
        backoff_factor: multiplier applied on backoff, in ``(0, 1)``; None means ``1 / growth_factor`` in float32.
        growth_interval: consecutive clean steps that trigger a growth (``scale_window``).
        hysteresis: the scale backs off on the ``hysteresis``-th overflow only.
        consecutive_hysteresis: True: any clean step refills the hysteresis (DeepSpeed's mode); False: a growth.
        refill_hysteresis_on_backoff: True: a backoff refills it too (Paddle's ``decr_every_n_nan_or_inf``).
        min_scale: floor of the scale; 0 means no floor (PyTorch's).
        max_scale: ceiling of the scale; None means the largest finite float32.

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

    fields = (StateField("good_steps"), StateField("hysteresis_left"))

    def __post_init__(self):
        def set_field(name, value):
            object.__setattr__(self, name, value)

        growth = check_finite_in_range("growth_factor", self.growth_factor, low=1.0, low_inclusive=False)
        refuse_float32_degenerate("growth_factor", growth, _f32(growth) <= 1.0, "rounds to 1.0")
        set_field("growth_factor", growth)
        backoff = float(_F32(1.0) / _F32(growth)) if self.backoff_factor is None else self.backoff_factor
        backoff = check_finite_in_range(
            "backoff_factor", backoff, low=0.0, high=1.0, low_inclusive=False, high_inclusive=False
        )
        refuse_float32_degenerate("backoff_factor", backoff, not 0.0 < _f32(backoff) < 1.0, "rounds to 0.0 or 1.0")
        set_field("backoff_factor", backoff)
        set_field("growth_interval", check_int_in_range("growth_interval", self.growth_interval, low=1))
        set_field("hysteresis", check_int_in_range("hysteresis", self.hysteresis, low=1))
        check_bool("consecutive_hysteresis", self.consecutive_hysteresis)
        check_bool("refill_hysteresis_on_backoff", self.refill_hysteresis_on_backoff)
        set_field("min_scale", check_finite_in_range("min_scale", self.min_scale, low=0.0))
        # A scale must be positive: with no floor (min_scale == 0) the lower bound is exclusive.
        floor = dict(low=self.min_scale, low_inclusive=self.min_scale > 0)
        max_scale = check_finite_in_range(
            "max_scale", FLOAT32_MAX if self.max_scale is None else self.max_scale, **floor
        )
        set_field("max_scale", None if self.max_scale is None else max_scale)
        init = check_finite_in_range("init_scale", self.init_scale, high=max_scale, **floor)
        with np.errstate(divide="ignore", over="ignore"):
            degenerate = not (_f32(init) > 0 and np.isfinite(_F32(1.0) / _F32(init)))
        refuse_float32_degenerate("init_scale", init, degenerate, "is 0 or has an infinite reciprocal")
        set_field("init_scale", init)

    @property
    def floor(self):
        """The effective minimum scale as float32 holds it (``min_scale`` rounded).

        Example:
            >>> LossScalePolicy(min_scale=0.7).floor < 0.7
            True
        """
        return _f32(self.min_scale)

    @property
    def ceiling(self):
        """The effective maximum scale as float32 holds it (``max_scale`` or the largest float32)."""
        return _f32(FLOAT32_MAX if self.max_scale is None else self.max_scale)

    # ---- the rule protocol ------------------------------------------------------------------------------------
    def settings(self):
        return dict(
            growth_factor=self.growth_factor,
            backoff_factor=self.backoff_factor,
            min_scale=self.floor,
            max_scale=self.ceiling,
            window=self.growth_interval,
            full_hysteresis=self.hysteresis,
        )

    def initial_state(self):
        return LossScaleState(scale=_f32(self.init_scale), good_steps=0, hysteresis_left=self.hysteresis)

    def update(self, overflow, statistics, scale, good_steps, left, growth, backoff, floor, ceiling, window, full):
        scale, good_steps, left = _within(scale, good_steps, left, floor, ceiling, window, full)
        backed_off = maximum(scale * backoff, floor)
        backed_off = where(backed_off < FLOAT32_TINY, backed_off * 0, backed_off)  # no subnormal scales
        exhausted = left <= 1
        if self.refill_hysteresis_on_backoff:
            left_if_overflow = where(exhausted, full, left - 1)
        else:
            left_if_overflow = maximum(left - 1, 1)
        good_steps = good_steps + 1
        grow = good_steps >= window
        grown = scale * growth
        grown = where(isfinite(grown), minimum(grown, ceiling), scale)  # never to inf
        left_if_clean = full if self.consecutive_hysteresis else where(grow, full, left)
        return (
            where(overflow, where(exhausted, backed_off, scale), where(grow, grown, scale)),
            where(overflow, 0, where(grow, 0, good_steps)),
            where(overflow, left_if_overflow, left_if_clean),
        )

    def scale_bounds(self):
        return self.floor, self.ceiling

    def check_state(self, state, names=None):
        names = names or {name: f"state.{name}" for name in state_names(self)}
        check_finite_in_range(names["scale"], state["scale"], low=self.floor, high=self.ceiling)
        check_int_in_range(names["good_steps"], state["good_steps"], low=0, high=self.growth_interval - 1)
        check_int_in_range(names["hysteresis_left"], state["hysteresis_left"], low=1, high=self.hysteresis)
        return state

    def view(self, scale, good_steps, left, growth, backoff, floor, ceiling, window, full):
        full = host_or_graph(full, self.hysteresis)
        return (
            scale,
            host_or_graph(growth, self.growth_factor),
            host_or_graph(backoff, self.backoff_factor),
            host_or_graph(window, self.growth_interval),
            full,
            good_steps,
            full - left,
        )

    def extras(self, state):
        """How a hysteresis works, when there is one (the frameworks' state dicts have no place for it)."""
        return {} if self.hysteresis == 1 else dict(zip(_FLAGS, self.structure()))

    def from_view(self, values, names, implied):
        """A saved scale, factors, window and counters (and hysteresis) make a policy of this one's hysteresis mode:
        the saved flags, or where none are saved the framework's own (``implied``) for a hysteresis this rule
        lacks, else this rule's. Range errors are also ``AssertionError`` (PyTorch and Paddle assert)."""
        hysteresis = values.get("hysteresis", self.hysteresis)
        if all(flag in values for flag in _FLAGS):
            flags = {flag: check_bool(names[flag], values[flag]) for flag in _FLAGS}
        elif hysteresis != 1 and self.hysteresis == 1:
            flags = {flag: implied.get(flag, getattr(self, flag)) for flag in _FLAGS}
        else:
            flags = dict(zip(_FLAGS, self.structure()))
        if tuple(flags.values()) != self.structure():
            raise ValueError(
                f"'state_dict' holds a rule with hysteresis {hysteresis} working as {flags}, but this scaler's "
                f"hysteresis works as {dict(zip(_FLAGS, self.structure()))}, which is fixed when it is built: load it "
                f"into a scaler built with that rule (Paddle's spelling, GradScaler(init_loss_scaling=...), for a "
                f"Paddle state; policy=... for another)."
            )
        fields = {name: values[name] for name in ("growth_factor", "backoff_factor", "growth_interval")}
        rule = self.changed(dict(fields, init_scale=values["scale"], hysteresis=hysteresis), names)
        good = check_int_in_range(names["good_steps"], values["good_steps"], low=0, high=rule.growth_interval - 1)
        bad = check_int_in_range(names["bad_steps"], values.get("bad_steps", 0), low=0, high=rule.hysteresis - 1)
        state = LossScaleState(scale=rule.init_scale, good_steps=good, hysteresis_left=rule.hysteresis - bad)
        rule.check_state(dataclasses.asdict(state))
        return rule, state

    def changed(self, fields, names):
        for name, value in fields.items():  # the frameworks have no "derive it" value
            if value is None:
                raise TypeError(f"'{names[name]}' must be a number, but got None.")
        try:
            with errors_named(names):
                return LossScalePolicy(**dict(vars(self), **fields))
        except ValueError as error:
            raise AssertionValueError(str(error)) from None

    def structure(self):
        return self.consecutive_hysteresis, self.refill_hysteresis_on_backoff

    def within(self, state):
        """The counters clipped to this rule's window and hysteresis; the scale kept."""
        state = as_mapping(self, state)
        return LossScaleState(
            scale=state["scale"],
            good_steps=min(state["good_steps"], self.growth_interval - 1),
            hysteresis_left=min(state["hysteresis_left"], self.hysteresis),
        )

    def as_state(self, state):
        return LossScaleState(**state)


def _within(scale, good_steps, left, floor, ceiling, window, full):
    """The scale and counters brought back within the rule's bounds: a state loaded from elsewhere (a checkpoint of
    another configuration, or MindSpore's inf scale) would otherwise never recover (``inf * 0.5`` is inf). A scale
    that is not finite restarts from the ceiling; a valid state passes through unchanged."""
    scale = where(isfinite(scale), minimum(maximum(scale, floor), ceiling), ceiling)
    return scale, minimum(maximum(good_steps, 0), window - 1), minimum(maximum(left, 1), full)


# MindSpore's update cell reads scale_factor/scale_window when it compiles, so assigning them before the first step
# changes its rule; ours holds the validated rule, where an assigned attribute would change nothing.
_CELL_ADVICE = (
    "the validated rule is held by the cell. Build a new cell (or DynamicLossScaleUpdateCell.from_policy(policy))."
)


class DynamicLossScaleUpdateCell(LossScaleUpdateCell):
    """Dynamic loss-scale update cell: :class:`lossscale.core.policy.LossScalePolicy` in graph, with the constructor
    of ``mindspore.nn.DynamicLossScaleUpdateCell`` plus keyword extensions.

    The scale grows by ``scale_factor`` on the ``scale_window``-th consecutive clean step (never to inf, never above
    ``max_loss_scale``), backs off by ``backoff_factor`` on the ``hysteresis``-th overflow, never below
    ``min_loss_scale``. Counters: ``loss_scale_good_steps`` and ``loss_scale_hysteresis_left`` (int32).

    Args:
        loss_scale_value (float), scale_factor (float), scale_window (int): MindSpore's.
        backoff_factor, hysteresis, consecutive_hysteresis, min_loss_scale, max_loss_scale,
        refill_hysteresis_on_backoff: see :class:`LossScalePolicy` (``min_scale``, ``max_scale``).
        mutable_rule (bool): ``mutable`` of :class:`LossScaleUpdateCell`.

    Example:
        >>> DynamicLossScaleUpdateCell(2**12, 2, 1000, hysteresis=2).policy.backoff_factor
        0.5
    """

    scale_factor = read_only("scale_factor", _CELL_ADVICE, lambda self: self._rule.growth_factor)
    scale_window = read_only("scale_window", _CELL_ADVICE, lambda self: self._rule.growth_interval)
    policy = read_only(
        "policy",
        "a compiled step keeps the rule it was built with. Build the cell with mutable_rule=True and call "
        "set_policy(policy), or build a new cell (from_policy(policy)).",
        lambda self: self._rule,
    )
    mutable_rule = read_only(
        "mutable_rule",
        "whether the rule is held in Parameters is fixed when the cell is built.",
        lambda self: self._mutable,
    )

    def __init__(self, loss_scale_value, scale_factor, scale_window, *, mutable_rule=False, **extensions):
        arguments = dict(extensions, loss_scale_value=loss_scale_value, scale_factor=scale_factor)
        fields = rule_fields(MINDSPORE_CELL, dict(arguments, scale_window=scale_window))
        with errors_named(MINDSPORE_CELL):
            policy = LossScalePolicy(**fields)
        super().__init__(policy, mutable=check_bool("mutable_rule", mutable_rule), loss_scale_value=loss_scale_value)

    @classmethod
    def from_policy(cls, policy, mutable_rule=False):
        """An update cell applying ``policy`` (e.g. a preset): :meth:`of_rule`.

        Example:
            >>> from lossscale.core.presets import get_preset
            >>> DynamicLossScaleUpdateCell.from_policy(get_preset("pytorch")).get_loss_scale()
            65536.0
        """
        return cls.of_rule(policy, mutable_rule)

    good_steps = property(lambda self: self.counters[0], doc="The Parameter of the clean steps toward a growth.")
    hysteresis_left = property(lambda self: self.counters[1], doc="The Parameter of the overflows until a backoff.")

    def set_policy(self, policy, state=None):
        """:meth:`set_rule` with a :class:`LossScalePolicy` of the same hysteresis mode."""
        refuse_immutable(self.mutable, "set_policy()")
        if not isinstance(policy, LossScalePolicy):
            raise TypeError(
                f"'policy' must be a LossScalePolicy (lossscale.get_preset(name) gives one by name), "
                f"but got {type(policy).__name__}."
            )
        if policy.structure() != self._rule.structure():
            raise ValueError(
                "'policy' must keep the hysteresis mode of this update cell "
                "(consecutive_hysteresis, refill_hysteresis_on_backoff)."
            )
        self.set_rule(policy, state)


LossScalePolicy.cell_class = DynamicLossScaleUpdateCell


# ---- the functional form (jmp's shape), over LossScaleState values -------------------------------------------------
def _checked(policy, state):
    if not isinstance(policy, LossScalePolicy):
        raise TypeError(f"'policy' must be a LossScalePolicy, but got {type(policy).__name__}.")
    if not isinstance(state, LossScaleState):
        raise TypeError(
            f"'state' must be a LossScaleState (state_from_dict reads a state dict), but got {type(state).__name__}."
        )
    return dataclasses.asdict(state)


def check_state(policy, state, names=("state.scale", "state.good_steps", "state.hysteresis_left")):
    """``state`` if it is reachable under ``policy``; ``ValueError`` naming the bad field as ``names`` spells it.

    Example:
        >>> check_state(LossScalePolicy(growth_interval=4), LossScaleState(scale=8.0, good_steps=3))
        LossScaleState(scale=8.0, good_steps=3, hysteresis_left=1)
    """
    mapping = _checked(policy, state)
    policy.check_state(mapping, dict(zip(("scale", "good_steps", "hysteresis_left"), names)))
    return state


def state_from_dict(policy, state_dict, owner="state_dict"):
    """The :class:`LossScaleState` of a ``{'loss_scale', 'good_steps', 'hysteresis_left'}`` dict, validated against
    ``policy``; every error names the key.

    Example:
        >>> state_from_dict(LossScalePolicy(init_scale=8.0), {"loss_scale": 4.0, "good_steps": 2, "hysteresis_left": 1})
        LossScaleState(scale=4.0, good_steps=2, hysteresis_left=1)
    """
    return LossScaleState(**from_state_dict(policy, state_dict, owner))


def initial_state(policy):
    """The state before the first step: ``init_scale`` rounded to float32, full hysteresis.

    Example:
        >>> initial_state(LossScalePolicy(init_scale=1024.0, hysteresis=2))
        LossScaleState(scale=1024.0, good_steps=0, hysteresis_left=2)
    """
    return policy.initial_state()


def update(policy, state, overflow):
    """The state after one step whose gradients did (``overflow=True``) or did not overflow; pure.

    Example:
        >>> p = LossScalePolicy(init_scale=4.0, growth_interval=1)
        >>> update(p, initial_state(p), overflow=False).scale
        8.0
    """
    check_state(policy, state)
    return advance(policy, state, overflow)


def run(policy, overflows, state=None):
    """:func:`update` for each overflow flag; the state after every step.

    Example:
        >>> [s.scale for s in run(LossScalePolicy(init_scale=2.0, growth_interval=3), [True, True])]
        [1.0, 1.0]
    """
    if state is not None:
        check_state(policy, state)
    return _run(policy, overflows, state)
