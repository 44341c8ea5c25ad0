"""Loss-scale managers: MindSpore's ``LossScaleManager`` API, producing our update cells.

A manager is the host-side description of a loss-scaling strategy. Training code
(``lossscale.Model``, ``lossscale.build_train_network``, or MindSpore's own ``Model``
on GPU/Ascend) asks it for an update cell with :meth:`get_update_cell` and wraps
the network in a train cell. From then on the device holds the truth:
``get_loss_scale()`` reads the scale back from the device (one host sync) and
``update_loss_scale()`` only refreshes the host mirror, so the policy is never
applied twice.
"""

import weakref

import numpy as np
from mindspore.amp import LossScaleManager

from lossscale.core._parameters import host_flags
from lossscale.core._validation import check_bool, check_finite_in_range, read_only
from lossscale.core.policy import (
    initial_state,
    policy_extensions,
    policy_from_mindspore_arguments,
    state_from_dict,
    update,
)
from lossscale.core.update_cells import DynamicLossScaleUpdateCell, FixedLossScaleUpdateCell, check_fixed_state
from lossscale.training.bookkeeping import PersistentOverflowError


def overflow_decision(overflow):
    """``overflow`` (what ``update_loss_scale`` is given) as a Python bool: a bool, a NumPy bool, or a bool Tensor or
    array, True if all its values are (MindSpore's ``Model`` passes ``np.all`` of the train cell's flag). Anything
    else is a TypeError: MindSpore's manager reads any truthy value (1, ``"no"``) as an overflow and None as a
    clean step.

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
        loss_scale (float): the scale, finite and >= 1. Default 128.0 (MindSpore's). Kept and
            reported as the float32 value the device holds.
        drop_overflow_update (bool): skip the optimizer on overflow (True, default)
            or always apply it (False). With False, ``get_update_cell()`` returns
            None like MindSpore; our train-network builders then unscale the
            gradients themselves unless the optimizer was built with the same
            ``loss_scale`` (MindSpore's convention), and reject any other value.

    Example:
        >>> manager = FixedLossScaleManager(1024.0, drop_overflow_update=False)
        >>> manager.get_loss_scale(), manager.get_update_cell()
        (1024.0, None)
    """

    def __init__(self, loss_scale=128.0, drop_overflow_update=True):
        # The scale the device holds and reports: float32 (2**24 + 1 is 2**24 there).
        self._loss_scale = float(np.float32(check_finite_in_range("loss_scale", loss_scale, low=1.0)))
        self._drop_overflow_update = check_bool("drop_overflow_update", drop_overflow_update)

    def get_loss_scale(self):
        """The fixed scale (no sync)."""
        return self._loss_scale

    def get_drop_overflow_update(self):
        """Whether overflowing steps are skipped."""
        return self._drop_overflow_update

    def update_loss_scale(self, overflow):
        """Does nothing: the scale is fixed (``overflow`` is checked as :func:`overflow_decision` does)."""
        overflow_decision(overflow)

    def get_update_cell(self):
        """A :class:`FixedLossScaleUpdateCell` if ``drop_overflow_update`` else None (as MindSpore)."""
        if not self._drop_overflow_update:
            return None
        return FixedLossScaleUpdateCell(self._loss_scale)

    def state_dict(self):
        """``{'loss_scale': float}``."""
        return {"loss_scale": self._loss_scale}

    def load_state_dict(self, state):
        """Check that ``state`` was saved by a manager with the same fixed scale (nothing to restore)."""
        check_fixed_state(state, self._loss_scale)


# MindSpore's manager lets loss_scale, scale_factor and scale_window be assigned; its next update cell then uses
# them while a running one keeps its own, and the attribute no longer says what trains. Ours refuses.
_MANAGER_ADVICE = (
    "the rule is validated and fixed when the manager is built, and an update cell already in use would "
    "keep the old one. Build a new manager with the value you want (or DynamicLossScaleManager."
    "from_policy(policy)); to change a training cell's scale, use train_cell.set_sense_scale(Tensor(...))."
)


class DynamicLossScaleManager(LossScaleManager):
    """Dynamic loss scaling: back off on overflow, grow after a window of clean steps.

    MindSpore's signature and defaults, plus the keyword extensions of
    :class:`lossscale.DynamicLossScaleUpdateCell` (backoff factor, hysteresis,
    min/max scale). Arguments are validated (``scale_factor`` must be > 1:
    MindSpore accepts 0.5, which inverts the policy).

    Host syncs: :meth:`get_loss_scale`, :meth:`update_loss_scale` and
    :meth:`state_dict` read the device once each when an update cell made by this
    manager is in use by a train cell; otherwise they are pure host operations.

    Args:
        init_loss_scale (float): initial scale. Default 2**24.
        scale_factor (float): growth factor (> 1). Default 2.
        scale_window (int): clean steps before growth (>= 1). Default 2000.
        backoff_factor, hysteresis, consecutive_hysteresis, min_loss_scale,
        max_loss_scale: see :class:`lossscale.DynamicLossScaleUpdateCell`.

    Example:
        >>> manager = DynamicLossScaleManager(init_loss_scale=2**10, scale_factor=2, scale_window=2)
        >>> for overflow in (False, False, True):
        ...     manager.update_loss_scale(overflow)
        >>> manager.get_loss_scale()
        1024.0
    """

    scale_factor = read_only("scale_factor", _MANAGER_ADVICE)
    scale_window = read_only("scale_window", _MANAGER_ADVICE)

    def __init__(
        self,
        init_loss_scale=2**24,
        scale_factor=2,
        scale_window=2000,
        *,
        backoff_factor=None,
        hysteresis=1,
        consecutive_hysteresis=False,
        min_loss_scale=1.0,
        max_loss_scale=None,
        refill_hysteresis_on_backoff=False,
    ):
        self.policy = policy_from_mindspore_arguments(
            "init_loss_scale",
            init_loss_scale,
            scale_factor,
            scale_window,
            backoff_factor=backoff_factor,
            hysteresis=hysteresis,
            consecutive_hysteresis=consecutive_hysteresis,
            min_loss_scale=min_loss_scale,
            max_loss_scale=max_loss_scale,
            refill_hysteresis_on_backoff=refill_hysteresis_on_backoff,
        )
        self._scale_factor = scale_factor
        self._scale_window = scale_window
        self._state = initial_state(self.policy)
        self._update_cells = []  # weak references to the cells get_update_cell() made, oldest first
        # MindSpore's host bookkeeping of update_loss_scale(), with its names and starting values.
        self.cur_iter = 1
        self.last_overflow_iter = 0
        self.bad_step = 0
        self.bad_step_max = 1000

    @classmethod
    def from_policy(cls, policy):
        """A manager applying ``policy`` (e.g. a preset from :mod:`lossscale.core.presets`).

        Example:
            >>> from lossscale.core.presets import get_preset
            >>> DynamicLossScaleManager.from_policy(get_preset("megatron")).policy.hysteresis
            2
        """
        return cls(policy.init_scale, policy.growth_factor, policy.growth_interval, **policy_extensions(policy))

    def _followed_cell(self):
        """The most recent living cell this manager made that a train cell has adopted; before any is adopted, the
        most recent one made (None before any). A cell made later only for a look does not take over."""
        cells = [cell for cell in (ref() for ref in self._update_cells) if cell is not None]
        adopted = [cell for cell in cells if cell.scale_parameter is not None]
        return (adopted or cells or [None])[-1]

    def _device_cell(self):
        """The followed update cell if a train cell has adopted it, else None."""
        cell = self._followed_cell()
        return cell if cell is not None and cell.scale_parameter is not None else None

    def get_state(self):
        """The current :class:`lossscale.core.policy.LossScaleState` (device value when in use)."""
        cell = self._device_cell()
        if cell is not None:
            self._state = cell.get_state()
        return self._state

    def get_loss_scale(self):
        """The current scale as a float; the device's value once training has started."""
        return self.get_state().scale

    @property
    def loss_scale(self):
        """Alias of :meth:`get_loss_scale` (MindSpore exposes ``loss_scale`` as an attribute)."""
        return self.get_loss_scale()

    @loss_scale.setter
    def loss_scale(self, value):
        raise AttributeError(f"DynamicLossScaleManager.loss_scale cannot be assigned: {_MANAGER_ADVICE}")

    @property
    def increase_ratio(self):
        """MindSpore's name for the growth factor."""
        return self.policy.growth_factor

    @property
    def decrease_ratio(self):
        """MindSpore's name for the backoff factor (``1 / scale_factor`` unless ``backoff_factor`` is given)."""
        return self.policy.backoff_factor

    def update_loss_scale(self, overflow):
        """Advance the policy one step on the host, and MindSpore's bookkeeping with it.

        When an update cell made by this manager is in use, the device has already
        applied the step; this call then only refreshes the host mirror (so
        ``mindspore.train.Model``, which calls it after every step outside sink mode,
        does not apply the policy twice).

        As MindSpore's manager: ``cur_iter`` counts the calls (from 1), ``last_overflow_iter`` is
        the last overflowing one and ``bad_step`` the overflows in a row; once ``bad_step``
        exceeds ``bad_step_max`` (1000) this raises a ``RuntimeError`` ("Dynamic loss scale Continuous
        overflow ...", a :class:`lossscale.PersistentOverflowError`), so a ``Model`` run that overflows at
        every step stops as MindSpore's does. With gradient accumulation, a call that ends inside a window
        (its output False decides nothing) only advances ``cur_iter``: ``bad_step`` counts overflowing
        optimizer steps in a row.

        Host syncs: one (the device state), two with accumulation (also the micro-step).
        """
        overflow = overflow_decision(overflow)
        cell = self._device_cell()
        if cell is None:
            self._state = self._host_update(overflow)
        else:
            self.get_state()
            if cell.window_open():  # a micro-batch inside an accumulation window: no step was decided
                self.cur_iter += 1
                return
        self._count(overflow)

    def _count(self, overflow):
        """MindSpore's ``update_loss_scale`` counters, and its stop after too many overflows in a row."""
        if overflow:
            self.last_overflow_iter = self.cur_iter
            self.bad_step += 1
        else:
            self.bad_step = 0
        if self.bad_step > self.bad_step_max:  # a RuntimeError, as MindSpore's, that our own callers recognise
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
        """A new :class:`DynamicLossScaleUpdateCell` starting from this manager's current state.

        The manager follows the most recent cell it made that a train cell has adopted (before any is, the most
        recent one made): ``get_loss_scale()`` reads it.
        """
        cell = self._new_cell(self.get_state())
        self._update_cells = [ref for ref in self._update_cells if ref() is not None] + [weakref.ref(cell)]
        return cell

    def _state_from_dict(self, state):
        """The state a state dict holds, validated against this manager's rule."""
        return state_from_dict(self.policy, state)

    def _host_update(self, overflow):
        """The state after one step, applied on the host (no update cell in use)."""
        return update(self.policy, self._state, overflow)

    def _new_cell(self, state):
        """A new update cell of this manager's rule, holding ``state``."""
        cell = DynamicLossScaleUpdateCell.from_policy(self.policy)
        cell.set_state(state)
        return cell

    def state_dict(self):
        """``{'loss_scale', 'good_steps', 'hysteresis_left'}`` (device values when in use)."""
        state = self.get_state()
        return {"loss_scale": state.scale, "good_steps": state.good_steps, "hysteresis_left": state.hysteresis_left}

    def load_state_dict(self, state):
        """Restore :meth:`state_dict` output, into the device cell too when one is in use (validated: nothing
        changes on error)."""
        restored = self._state_from_dict(state)
        cell = self._followed_cell()
        if cell is not None:
            cell.set_state(restored)
        self._state = restored
