"""Loss-scale managers: MindSpore's ``LossScaleManager`` API over any rule, producing update cells.

A manager describes a strategy on the host; ``lossscale.Model``, ``build_train_network`` or MindSpore's own ``Model``
ask it for an update cell (:meth:`get_update_cell`). Once a train cell uses that cell the device holds the truth:
``get_loss_scale()`` reads it (one host sync) and ``update_loss_scale()`` only refreshes the host mirror, so the rule
is never applied twice. ``DynamicLossScaleManager.from_policy(rule)`` takes any rule.
"""

import weakref

import numpy as np
from mindspore.amp import LossScaleManager

from lossscale.core._parameters import host_flags
from lossscale.core._validation import check_bool, check_finite_in_range, read_only
from lossscale.core.adaptive import MAX_SCALE_WINDOW, MIN_SCALE_WINDOW, AdaptiveWindowRule
from lossscale.core.policy import LossScalePolicy
from lossscale.core.rule import FixedRule, advance, as_mapping, from_state_dict, host_view, to_state_dict
from lossscale.core.spelling import MINDFORMERS_MANAGER, MINDSPORE_MANAGER, errors_named, rule_fields
from lossscale.core.update_cells import FixedLossScaleUpdateCell, check_rule, update_cell_of
from lossscale.training.bookkeeping import PersistentOverflowError


def overflow_decision(overflow):
    """``overflow`` (what ``update_loss_scale`` is given) as a Python bool: a bool, a NumPy bool, or a bool Tensor or
    array, True if all its values are (MindSpore's ``Model`` passes ``np.all`` of the train cell's flag). Anything
    else is a TypeError: MindSpore's manager reads any truthy value (1, ``"no"``) as an overflow and None as clean.

    Example:
        >>> overflow_decision(np.array([True, True])), overflow_decision(False)
        (True, False)
    """
    flags = host_flags(overflow)
    if flags is None:
        raise TypeError(
            f"'overflow' must be a bool, or a bool Tensor or array (the train cell's flag), but got "
            f"{overflow!r} of type {type(overflow).__name__}."
        )
    return bool(np.all(flags))


class FixedLossScaleManager(LossScaleManager):
    """A constant loss scale, with or without skipping overflowing steps.

    Args:
        loss_scale (float): the scale, finite and >= 1. Default 128.0 (MindSpore's), reported as the float32 value the
            device holds.
        drop_overflow_update (bool): skip the optimizer on overflow (True, default) or always apply it (False). With
            False, ``get_update_cell()`` returns None like MindSpore's; the train-network builders then unscale the
            gradients themselves unless the optimizer was built with the same ``loss_scale``.

    Example:
        >>> manager = FixedLossScaleManager(1024.0, drop_overflow_update=False)
        >>> manager.get_loss_scale(), manager.get_update_cell()
        (1024.0, None)
    """

    def __init__(self, loss_scale=128.0, drop_overflow_update=True):
        self._loss_scale = float(np.float32(check_finite_in_range("loss_scale", loss_scale, low=1.0)))
        self._drop_overflow_update = check_bool("drop_overflow_update", drop_overflow_update)

    def get_loss_scale(self):
        """The fixed scale (no sync)."""
        return self._loss_scale

    def get_drop_overflow_update(self):
        """Whether overflowing steps are skipped."""
        return self._drop_overflow_update

    def update_loss_scale(self, overflow):
        """Nothing: the scale is fixed (``overflow`` is checked as :func:`overflow_decision` does)."""
        overflow_decision(overflow)

    def get_update_cell(self):
        """A :class:`FixedLossScaleUpdateCell` if ``drop_overflow_update`` else None (as MindSpore's)."""
        return FixedLossScaleUpdateCell(self._loss_scale) if self._drop_overflow_update else None

    def state_dict(self):
        """``{'loss_scale': float}``."""
        return {"loss_scale": self._loss_scale}

    def load_state_dict(self, state):
        """Check that ``state`` was saved by a manager with the same fixed scale (nothing to restore)."""
        from_state_dict(FixedRule(self._loss_scale), state)


# MindSpore's manager lets loss_scale, scale_factor and scale_window be assigned; its next update cell then uses them
# while a running one keeps its own, and the attribute no longer says what trains. Ours refuses.
_MANAGER_ADVICE = (
    "the rule is validated and fixed when the manager is built, and an update cell already in use would keep the "
    "old one. Build a new manager with the value you want (or DynamicLossScaleManager.from_policy(policy)); to change "
    "a training cell's scale, use train_cell.set_sense_scale(Tensor(...))."
)


class DynamicLossScaleManager(LossScaleManager):
    """Dynamic loss scaling: back off on overflow, grow after a window of clean steps (or any rule: ``from_policy``).

    MindSpore's signature and defaults, plus the keyword extensions of :class:`lossscale.DynamicLossScaleUpdateCell`
    (backoff factor, hysteresis, min/max scale). Arguments are validated (``scale_factor`` must be > 1: MindSpore
    accepts 0.5, which inverts the rule). Host syncs: :meth:`get_loss_scale`, :meth:`update_loss_scale` and
    :meth:`state_dict` read the device once each when a cell made by this manager is in use by a train cell.

    Args:
        init_loss_scale (float): initial scale. Default 2**24.
        scale_factor (float): growth factor (> 1). Default 2.
        scale_window (int): clean steps before growth (>= 1). Default 2000.
        backoff_factor, hysteresis, consecutive_hysteresis, min_loss_scale, max_loss_scale,
        refill_hysteresis_on_backoff: see :class:`lossscale.DynamicLossScaleUpdateCell`.

    Example:
        >>> manager = DynamicLossScaleManager(init_loss_scale=2**10, scale_factor=2, scale_window=2)
        >>> for overflow in (False, False, True):
        ...     manager.update_loss_scale(overflow)
        >>> manager.get_loss_scale()
        1024.0
    """

    scale_factor = read_only("scale_factor", _MANAGER_ADVICE, lambda self: self._arguments[0])
    scale_window = read_only("scale_window", _MANAGER_ADVICE, lambda self: self._arguments[1])
    policy = read_only("policy", _MANAGER_ADVICE, lambda self: self._rule)

    def __init__(self, init_loss_scale=2**24, scale_factor=2, scale_window=2000, **extensions):
        arguments = dict(extensions, init_loss_scale=init_loss_scale, scale_factor=scale_factor)
        fields = rule_fields(MINDSPORE_MANAGER, dict(arguments, scale_window=scale_window))
        with errors_named(MINDSPORE_MANAGER):
            rule = LossScalePolicy(**fields)
        self._adopt(rule, (scale_factor, scale_window))

    def _adopt(self, rule, arguments=(None, None)):
        """Start from ``rule``'s initial state, with MindSpore's host bookkeeping (its names and starting values)."""
        self._rule, self._arguments = check_rule(rule), arguments
        self._state = rule.initial_state()
        self._update_cells = []  # weak references to the cells get_update_cell() made, oldest first
        self.cur_iter, self.last_overflow_iter, self.bad_step, self.bad_step_max = 1, 0, 0, 1000

    @classmethod
    def from_policy(cls, policy):
        """A manager applying ``policy``: any rule (:mod:`lossscale.core.rule`; a preset, say).

        Example:
            >>> from lossscale.core.presets import get_preset
            >>> DynamicLossScaleManager.from_policy(get_preset("megatron")).policy.hysteresis
            2
        """
        manager = cls.__new__(cls)
        view = host_view(check_rule(policy), policy.initial_state()) or {}
        manager._adopt(policy, (view.get("growth_factor"), view.get("growth_interval")))
        return manager

    def _followed_cell(self):
        """The most recent living cell this manager made that a train cell has adopted; before any is adopted, the
        most recent one made (None before any). A cell made later only for a look does not take over."""
        cells = [cell for cell in (ref() for ref in self._update_cells) if cell is not None]
        adopted = [cell for cell in cells if cell.scale_parameter is not None]
        return (adopted or cells or [None])[-1]

    def _device_cell(self):
        cell = self._followed_cell()
        return cell if cell is not None and cell.scale_parameter is not None else None

    def get_state(self):
        """The current state in the rule's form (the device's when a cell is in use)."""
        cell = self._device_cell()
        if cell is not None:
            self._state = cell.get_state()
        return self._state

    def get_loss_scale(self):
        """The current scale as a float; the device's once training has started."""
        return as_mapping(self._rule, self.get_state())["scale"]

    @property
    def loss_scale(self):
        """Alias of :meth:`get_loss_scale` (MindSpore exposes ``loss_scale`` as an attribute)."""
        return self.get_loss_scale()

    @loss_scale.setter
    def loss_scale(self, value):
        raise AttributeError(f"{type(self).__name__}.loss_scale cannot be assigned: {_MANAGER_ADVICE}")

    def _ratio(self, name):
        view = host_view(self._rule, self._state)
        return None if view is None else float(view[name])

    increase_ratio = property(lambda self: self._ratio("growth_factor"), doc="MindSpore's name: the growth factor.")
    decrease_ratio = property(lambda self: self._ratio("backoff_factor"), doc="MindSpore's name: the backoff factor.")

    def update_loss_scale(self, overflow):
        """Advance the rule one step on the host, and MindSpore's bookkeeping with it; with a cell in use, only
        refresh the host mirror (``Model`` calls this after every step outside sink mode).

        As MindSpore's manager: ``cur_iter`` counts the calls (from 1), ``last_overflow_iter`` is the last
        overflowing one and ``bad_step`` the overflows in a row; past ``bad_step_max`` (1000) a
        :class:`lossscale.PersistentOverflowError` (a ``RuntimeError``, as MindSpore's) stops the run. A call that ends
        inside an accumulation window (its False decides nothing) only advances ``cur_iter``."""
        overflow = overflow_decision(overflow)
        cell = self._device_cell()
        if cell is None:
            self._state = advance(self._rule, self._state, overflow)
        else:
            self.get_state()
            if cell.window_open():
                self.cur_iter += 1
                return
        self._count(overflow)

    def _count(self, overflow):
        """MindSpore's ``update_loss_scale`` counters, and its stop after too many overflows in a row."""
        self.last_overflow_iter = self.cur_iter if overflow else self.last_overflow_iter
        self.bad_step = self.bad_step + 1 if overflow else 0
        if self.bad_step > self.bad_step_max:
            raise PersistentOverflowError(
                f"Dynamic loss scale Continuous overflow {self.bad_step} times, has exceeded maximum threshold "
                f"(bad_step_max={self.bad_step_max}, as in MindSpore's manager); the loss scale is "
                f"{self.get_loss_scale()!r}. Look for inf/nan in the data or the loss, or use the train cell's "
                f"overflow_policy and max_consecutive_overflows."
            )
        self.cur_iter += 1

    def get_drop_overflow_update(self):
        """Always True: dynamic scaling skips overflowing steps."""
        return True

    def get_update_cell(self):
        """A new update cell of the rule, starting from this manager's current state; the manager follows the most
        recent cell it made that a train cell has adopted (``get_loss_scale()`` reads it)."""
        cell = update_cell_of(self._rule)
        cell.set_state(self.get_state())
        self._update_cells = [ref for ref in self._update_cells if ref() is not None] + [weakref.ref(cell)]
        return cell

    def state_dict(self):
        """The state under the rule's keys (``loss_scale``, ...); the device's when a cell is in use."""
        return to_state_dict(self._rule, self.get_state())

    def load_state_dict(self, state):
        """Restore :meth:`state_dict` output, into the cell in use too (checked: nothing changes on error)."""
        restored = self._rule.as_state(from_state_dict(self._rule, state))
        cell = self._followed_cell()
        if cell is not None:
            cell.set_state(restored)
        self._state = restored


class AdaptiveLossScaleManager(DynamicLossScaleManager):
    """MindFormers' adaptive window (:class:`lossscale.AdaptiveWindowRule`) behind MindSpore's manager API.

    Args:
        init_loss_scale (float): initial scale, finite and >= 1. Default 2**24 (MindSpore's managers').
        scale_factor (float): growth and back-off factor (> 1). Default 2.
        scale_window (int): the starting window, one of the levels. Default 20, the lowest of the default bounds.
        max_scale_window (int), min_scale_window (int): the top and lowest levels. Default 1000 and 20.

    Example:
        >>> manager = AdaptiveLossScaleManager(init_loss_scale=2**12, scale_window=20)
        >>> type(manager.get_update_cell()).__name__, manager.rule.levels[:3]
        ('AdaptiveLossScaleUpdateCell', (20, 30, 40))
    """

    def __init__(
        self,
        init_loss_scale=2**24,
        scale_factor=2,
        scale_window=MIN_SCALE_WINDOW,
        max_scale_window=MAX_SCALE_WINDOW,
        min_scale_window=MIN_SCALE_WINDOW,
    ):
        with errors_named(MINDFORMERS_MANAGER):
            rule = AdaptiveWindowRule(init_loss_scale, scale_factor, scale_window, max_scale_window, min_scale_window)
        self._adopt(rule, (scale_factor, scale_window))

    @property
    def rule(self):
        """The :class:`lossscale.AdaptiveWindowRule` (the manager's ``policy``)."""
        return self._rule
