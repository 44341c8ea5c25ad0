"""The loss-scale rule protocol: what decides the scale, one class per kind of rule (docs/design.md, section 1).

A rule is an immutable value (a frozen dataclass with an ``init_scale``). It declares its state (the scale and
its :class:`StateField` counters), the numbers its update reads (:meth:`LossScaleRule.settings`), and one pure
update from a state to the next, written with the helpers below so that it runs both on the host (NumPy scalars) and
in a compiled graph (MindSpore Tensors), in float32 and int32 alike. The update takes the state positionally and
returns a tuple (a dict in a graph made MindSpore mis-fold other branches of it, measured). Update cells,
``LossScaler``, managers, the train cell and every front-end drive any rule through this protocol alone.

Example:
    >>> rule = FixedRule(init_scale=1024.0)
    >>> run(rule, [True, False])[-1]
    {'scale': 1024.0}
"""

import dataclasses
import functools
import itertools
from collections.abc import Mapping
from typing import Iterable, Optional

import numpy as np
from mindspore import Tensor, jit_class, ops

from lossscale.core._validation import FLOAT32_MAX, check_finite_in_range, check_int_in_range, positive_float32

FLOAT32, INT32 = "float32", "int32"
_NUMPY = {FLOAT32: np.float32, INT32: np.int32}


# ---- arithmetic for both worlds: NumPy scalars on the host, Tensors in a graph ------------------------------------
# Each helper asks whether it holds a Tensor: a compiled graph resolves that test natively (a test of NumPy's types
# went through MindSpore's Python fallback, which made it mis-fold other branches of the same graph, measured).


def where(condition, if_true, if_false):
    """``if_true`` where ``condition`` holds, else ``if_false`` (``ops.select`` in a graph)."""
    if isinstance(condition, Tensor):
        return ops.select(condition, if_true, if_false)
    return if_true if condition else if_false


def _any_tensor(a, b):
    return isinstance(a, Tensor) or isinstance(b, Tensor)


def minimum(a, b):
    """The smaller of ``a`` and ``b`` (nan if either is)."""
    return ops.minimum(a, b) if _any_tensor(a, b) else np.minimum(a, b)


def maximum(a, b):
    """The larger of ``a`` and ``b`` (nan if either is)."""
    return ops.maximum(a, b) if _any_tensor(a, b) else np.maximum(a, b)


def isfinite(x):
    """Whether ``x`` is finite."""
    return ops.isfinite(x) if isinstance(x, Tensor) else np.isfinite(x)


def logical_and(a, b):
    """``a and b``."""
    return ops.logical_and(a, b) if _any_tensor(a, b) else bool(a) and bool(b)


def logical_or(a, b):
    """``a or b``."""
    return ops.logical_or(a, b) if _any_tensor(a, b) else bool(a) or bool(b)


def logical_not(a):
    """``not a``."""
    return ops.logical_not(a) if isinstance(a, Tensor) else not a


# ---- state dicts ----------------------------------------------------------------------------------------------
def state_value(name, value):
    """One number of a state dict as a Python int or float: a number, a NumPy scalar or a one-element array or
    Tensor; ``TypeError`` naming ``name`` otherwise (bools included).

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


def state_dict_values(state_dict, keys, owner="state_dict"):
    """``{key: number}`` for ``keys`` of a state dict: ``TypeError`` if it is not a dict, ``ValueError`` naming the
    missing keys, and :func:`state_value` for each value."""
    if not isinstance(state_dict, Mapping):
        raise TypeError(f"'{owner}' must be a dict, but got {type(state_dict).__name__}.")
    missing = [key for key in keys if key not in state_dict]
    if missing:
        raise ValueError(
            f"'{owner}' is missing {missing}; a saved state has the keys {list(keys)}, but got "
            f"{sorted(map(str, state_dict))}."
        )
    return {key: state_value(f"{owner}[{key!r}]", state_dict[key]) for key in keys}


@dataclasses.dataclass(frozen=True)
class StateField:
    """One counter of a rule's state: its ``name`` in the state, its ``dtype`` (``"int32"`` or ``"float32"``), its
    ``key`` in ``state_dict()`` (default the name) and the ``parameter`` holding it in a train cell's checkpoint
    (default ``loss_scale_<name>``)."""

    name: str
    dtype: str = INT32
    key: Optional[str] = None
    parameter: Optional[str] = None

    def __post_init__(self):
        if self.dtype not in _NUMPY:
            raise ValueError(f"'dtype' must be one of {tuple(_NUMPY)}, but got {self.dtype!r}.")
        object.__setattr__(self, "key", self.key or self.name)
        object.__setattr__(self, "parameter", self.parameter or f"loss_scale_{self.name}")


SCALE = StateField("scale", FLOAT32, key="loss_scale", parameter="scale_sense")
# What a view says, in order (see LossScaleRule.view).
VIEW = ("scale", "growth_factor", "backoff_factor", "growth_interval", "hysteresis", "good_steps", "bad_steps")


@jit_class  # a compiled graph calls its methods natively (no Python fallback)
class LossScaleRule:
    """The protocol every rule implements: subclass it as a frozen dataclass with an ``init_scale`` field.

    Override :meth:`update` and, for a rule with counters, :attr:`fields`; the rest has defaults. On the host a state
    is a dict (or the rule's state class) of ``"scale"`` and each counter of :attr:`fields`; :meth:`update` takes
    the scale, the counters and the numbers of :meth:`settings` as positional arguments, in that order, and returns
    the new scale and counters as a tuple.

    Example:
        >>> @dataclasses.dataclass(frozen=True)
        ... class Halving(LossScaleRule):       # halve on each overflow, never grow
        ...     init_scale: float
        ...     def update(self, overflow, statistics, scale):
        ...         return (where(overflow, scale * 0.5, scale),)
        >>> [state["scale"] for state in run(Halving(8.0), [True, False, True])]
        [4.0, 4.0, 2.0]
    """

    dynamic = True  # False: the scale never changes
    fields = ()  # the counters (StateField), besides the scale

    def settings(self):
        """``{name: number}`` the update reads from its state: held as Tensors in a graph (Parameters where a
        front-end's setters change them), so no float constant is multiplied in. Default: none."""
        return {}

    def initial_state(self):
        """The state before the first step (:meth:`as_state`): the initial scale as float32 holds it, each counter
        0."""
        return self.as_state(dict(scale=float(np.float32(self.init_scale)), **{field.name: 0 for field in self.fields}))

    statistics = ()  # the names of the gradient statistics the update reads (:meth:`measure` computes them)

    def measure(self, hyper_map, grads, scale, *settings):
        """Graph: the statistics :attr:`statistics` names, of the gradients ``grads`` at the ``scale`` that would
        multiply them back to the scaled ones, with the settings; each a float32 scalar that adds up over gradients
        and ranks (a count, a sum), since the core sums them over the ranks. Computed beside the overflow check, on
        its buffers where it can (:func:`lossscale.core.gradients.grouped_total`). Default: none."""
        return ()

    def update(self, overflow, statistics, scale, *state):
        """``(scale, *counters)`` after one step that did (``overflow``) or did not overflow, from the ``scale``, the
        counters and the settings (positional, in that order); ``statistics``: a tuple of the gradient statistics
        :attr:`statistics` names. Pure; see the module docstring."""
        raise NotImplementedError

    def scale_bounds(self):
        """``(low, high)``: the scales this rule can hold (what a setter or a loaded state may write)."""
        return 0.0, FLOAT32_MAX

    def describe(self):
        """One line naming the rule and its numbers (errors quote it). Default: its ``repr``."""
        return repr(self)

    def check_state(self, state, names=None):
        """``state`` (Python numbers) if this rule can hold it, else ``TypeError``/``ValueError`` naming the entry as
        ``names`` spells it (default ``state_dict['<key>']``). Rules add their own ranges."""
        names = names or {field.name: f"state_dict[{field.key!r}]" for field in (SCALE, *self.fields)}
        low, high = self.scale_bounds()
        check_finite_in_range(names["scale"], state["scale"], low=low, high=high, low_inclusive=low > 0)
        for field in self.fields:
            if field.dtype == INT32:
                check_int_in_range(names[field.name], state[field.name], low=-(2**31), high=2**31 - 1)
        return state

    # ---- how the frameworks' front-ends read and write a rule (optional) ---------------------------------------
    def view(self, scale, *state):
        """The state (the scale, counters and settings, as :meth:`update` takes them) as PyTorch's and Paddle's
        getters and state dicts read a rule: a tuple in :data:`VIEW` order, on the host or in a graph; None for a
        rule without such a reading (a front-end then saves the rule's own state only)."""
        return None

    def extras(self, state):
        """Keys a front-end's state dict holds besides the view (what the view cannot say). Default: none."""
        return {}

    def from_view(self, values, names, implied):
        """``(rule, state)`` from a front-end's saved ``values`` (the view's names and :meth:`extras`' keys), checked
        against this rule; errors name each value as ``names`` spells it; ``implied``: the extras a framework's own
        state dicts leave out. Default: a rule without a view has none."""
        raise NotImplementedError(f"{type(self).__name__} has no framework view")

    def changed(self, fields, names):
        """This rule with the view's ``fields`` changed (the frameworks' setters: ``init_scale``, ``growth_factor``,
        ...), checked; errors name each as ``names`` spells it. Default: only the initial scale can change."""
        for name in fields:
            if name != "init_scale":
                raise ValueError(
                    f"'{names[name]}' cannot change in {type(self).__name__} (a constant of its update graph): build "
                    f"the scaler with another rule."
                )
        low, high = self.scale_bounds()
        scale = check_finite_in_range(
            names["init_scale"], fields["init_scale"], low=max(low, 0.0), high=high, low_inclusive=low > 0
        )
        return self.restarted(scale)

    def restarted(self, scale):
        """This rule with ``scale`` as its initial scale (what the frameworks' setters and loads do)."""
        return dataclasses.replace(self, init_scale=scale)

    def structure(self):
        """What a compiled update depends on besides :meth:`settings`: a mutable cell takes another rule only if it
        has the same. Default: every field but the initial scale."""
        return tuple((f.name, getattr(self, f.name)) for f in dataclasses.fields(self) if f.name != "init_scale")

    def within(self, state):
        """``state`` (of a rule of the same structure) brought within this rule's ranges: what a rule switched to
        keeps of the state. Default: unchanged."""
        return state

    def as_state(self, state):
        """A host state as callers see it (a rule may return its own state class); default the dict itself."""
        return dict(state)


@functools.lru_cache(maxsize=None)
def _class_layout(rule_class):
    return (("scale", np.float32),) + tuple((field.name, _NUMPY[field.dtype]) for field in rule_class.fields)


def _layout(rule):
    """``((name, NumPy dtype), ...)`` of ``rule``'s state, the scale first."""
    return _class_layout(type(rule))


@functools.lru_cache(maxsize=64)
def _cached_settings(rule):
    return tuple(_setting_value(value) for value in rule.settings().values())


def _setting_value(value):
    """A setting as a NumPy scalar: int32 for an int, float32 for anything else."""
    integer = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
    return np.int32(value) if integer else np.float32(value)


def _settings_values(rule):
    """``rule.settings()`` as NumPy scalars (cached for a hashable rule)."""
    try:
        return _cached_settings(rule)
    except TypeError:  # an unhashable rule (a user's, with a list field, say)
        return tuple(_setting_value(value) for value in rule.settings().values())


# ---- the host side of any rule -----------------------------------------------------------------------------------
def state_names(rule):
    """The names of ``rule``'s state: ``"scale"``, then each counter's."""
    return ("scale",) + tuple(field.name for field in rule.fields)


def as_mapping(rule, state, argument="state"):
    """A state of ``rule`` (a dict, or the rule's state class) as a dict of its names; ``TypeError`` naming
    ``argument`` for anything else, or a state without one of the names."""
    names = state_names(rule)
    if isinstance(state, Mapping) and all(name in state for name in names):
        return {name: state[name] for name in names}
    if not isinstance(state, (Mapping, tuple, list)) and all(hasattr(state, name) for name in names):
        return {name: getattr(state, name) for name in names}
    raise TypeError(
        f"'{argument}' must be a state of {type(rule).__name__}: a dict (or its state class) of {list(names)}, "
        f"but got {state!r} of type {type(state).__name__}."
    )


def host_state(rule, state):
    """``state`` and ``rule.settings()`` as NumPy float32 and int32 scalars, in the update's order: the host's form
    of its input (so that its arithmetic rounds as the device's)."""
    mapping = as_mapping(rule, state)
    values = [dtype(mapping[name]) for name, dtype in _layout(rule)]
    return tuple(values) + _settings_values(rule)


def host_view(rule, state):
    """``rule.view`` of a host state as ``{name: Python number}`` (None for a rule without a view)."""
    view = rule.view(*host_state(rule, state))
    return None if view is None else {name: _python(value) for name, value in zip(VIEW, view)}


def advance(rule, state, overflow, statistics=None):
    """``rule.update`` on the host: the next state (``rule.as_state``).

    Example:
        >>> advance(FixedRule(8.0), {"scale": 8.0}, True)
        {'scale': 8.0}
    """
    if not isinstance(overflow, (bool, np.bool_)):  # a truthy "no" or 1 is not a decision
        raise TypeError(f"'overflow' must be a bool, but got {overflow!r} of type {type(overflow).__name__}.")
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):  # float32 arithmetic, as on the device
        new = rule.update(np.bool_(overflow), tuple(statistics or ()), *host_state(rule, state))
    return rule.as_state({name: dtype(value).item() for (name, dtype), value in zip(_layout(rule), new)})


def to_state_dict(rule, state):
    """``state`` under its state-dict keys (``loss_scale``, then each counter's key)."""
    state = as_mapping(rule, state)
    return {field.key: state[field.name] for field in (SCALE, *rule.fields)}


def from_state_dict(rule, saved, owner="state_dict"):
    """The state (a dict) that ``saved``, a :func:`to_state_dict`, holds, checked by ``rule.check_state``; errors name
    the key."""
    fields = (SCALE, *rule.fields)
    values = state_dict_values(saved, tuple(field.key for field in fields), owner)
    for field in rule.fields:
        if field.dtype == INT32 and not isinstance(values[field.key], int):
            raise TypeError(f"'{owner}[{field.key!r}]' must be an int, but got {values[field.key]!r}.")
    state = {field.name: values[field.key] for field in fields}
    state["scale"] = float(state["scale"])
    return rule.check_state(state, {field.name: f"{owner}[{field.key!r}]" for field in fields})


@dataclasses.dataclass(frozen=True)
class FixedRule(LossScaleRule):
    """A fixed scale: it never changes; a step with inf/nan is still skipped.

    Example:
        >>> FixedRule(init_scale=2.0**10).initial_state()
        {'scale': 1024.0}
    """

    init_scale: float
    dynamic = False

    def __post_init__(self):
        positive_float32("init_scale", self.init_scale)
        object.__setattr__(self, "init_scale", float(self.init_scale))

    def update(self, overflow, statistics, scale):
        return (scale,)

    def scale_bounds(self):
        scale = float(np.float32(self.init_scale))  # as the device holds it
        return scale, scale

    def check_state(self, state, names=None):
        """Its state must hold exactly its scale (in float32, as the device holds both)."""
        name = (names or {}).get("scale", "state_dict['loss_scale']")
        if np.float32(state["scale"]) != np.float32(self.init_scale):
            raise ValueError(
                f"'{name}' must equal the fixed loss scale {self.init_scale!r}, but got {state['scale']!r}."
            )
        return state


def host_or_graph(value, host_value):
    """``host_value`` on the host (a rule's exact Python number), ``value`` in a graph (the setting the cell holds, a
    Parameter that its setters change): what a view reports of a setting."""
    return value if isinstance(value, Tensor) else host_value


def _python(value):
    """A NumPy scalar as a Python number; anything else as it is."""
    return value.item() if isinstance(value, np.generic) else value


def run(rule, overflows: Iterable[bool], state=None, statistics=None):
    """:func:`advance` for each overflow flag, from ``state`` (default the initial one); the state after
    every step. ``statistics``: each step's gradient statistics, for a rule that reads some.

    Example:
        >>> [state["scale"] for state in run(FixedRule(4.0), [True, True])]
        [4.0, 4.0]
    """
    state = rule.initial_state() if state is None else state
    trajectory = []
    for overflow, measured in zip(overflows, itertools.repeat(()) if statistics is None else statistics):
        state = advance(rule, state, overflow, measured)
        trajectory.append(state)
    return trajectory
