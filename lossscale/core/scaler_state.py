"""The host side of a :class:`lossscale.core.scaler.LossScaler`: its scale and rule read, checked, written and saved.

Everything here runs in Python between steps (``get_scale`` and ``get_scale_tensor`` also inside a compiled
function, as graph reads). What the rule allows (bounds, counters, which keys a state holds) is asked of the
rule's adapter (:mod:`lossscale.core.rule_kinds`), chosen when the core is built, so no method branches on the
kind of rule::

    core.get_scale()                     # a float (one host sync); a graph read when compiled
    core.set_scale(1024.0)               # checked against the rule's bounds, then written
    state = core.state_dict()            # {'loss_scale', 'good_steps', 'hysteresis_left'}
    core.load_state_dict(state)          # validated; nothing changes on error
"""

import numbers

import numpy as np
from mindspore import Tensor
from mindspore.common import dtype as mstype

from lossscale.core._parameters import read_scalar, write_parameter
from lossscale.core._validation import positive_float32
from lossscale.core.policy import state_dict_values


def positive_scale(name, value):
    """``value`` (number or Tensor) as a float32 numpy scalar that is finite, > 0 and whose reciprocal
    is finite; else ``ValueError`` naming ``name`` (a scale of 1e-45 is > 0 but 1/S is inf)."""
    if isinstance(value, Tensor):
        array = value.asnumpy()
    elif isinstance(value, numbers.Real) and not isinstance(value, bool):
        array = np.asarray(value)
    else:
        raise TypeError(f"'{name}' must be a number or a float Tensor, but got {type(value).__name__}.")
    if array.dtype == np.bool_ or array.size != 1:
        raise TypeError(f"'{name}' must be one float value, but got {array.dtype} of shape {array.shape}.")
    return positive_float32(name, array.reshape(-1)[0])


class ScalerHostState:
    """Mixin of :class:`lossscale.core.scaler.LossScaler`: the host methods. It reads what the core builds:
    ``scale_value`` (the scale Parameter, or a constant when frozen), ``update_cell``, ``_kind`` (the rule's
    adapter), ``_frozen`` and ``_frozen_scale``."""

    @property
    def policy(self):
        """The dynamic rule (:class:`lossscale.core.policy.LossScalePolicy`), or None for a fixed scale or a
        foreign update cell."""
        return self._kind.policy

    @property
    def dynamic(self):
        """Whether the scale changes with overflows."""
        return self._kind.dynamic

    def get_scale(self):
        """The scale the device holds: eagerly a Python float (one host sync); inside a compiled function a
        float32 scalar Tensor read when the graph runs (:func:`lossscale.core._parameters.read_scalar`). A frozen
        scale is a Python float everywhere (no sync)."""
        if self._frozen:
            return self._frozen_scale
        return read_scalar(self.scale_value)

    def get_scale_tensor(self):
        """:meth:`get_scale` as a float32 scalar Tensor: eagerly a copy (one host sync), inside a compiled function
        the graph read itself."""
        scale = self.get_scale()
        return scale if isinstance(scale, Tensor) else Tensor(scale, mstype.float32)

    def check_update_cell_owner(self):
        """RuntimeError if another core (another train cell) has adopted this core's update cell since: an update
        cell holds one scale's counters, so two train cells sharing one would grow and back off each other's
        scales, silently. A cell that is no longer used may lose its update cell freely, and a fixed update cell,
        which holds nothing, may be shared (host; no sync)."""
        self._kind.check_owner(self)

    def set_scale(self, value):
        """Write a new scale (host to device, no graph rebuild): :meth:`checked_scale` first, so a dynamic rule's
        bounds hold (the state is then one :meth:`load_state_dict` accepts)."""
        if self._frozen:
            raise ValueError("this loss scale is frozen (a graph constant): it cannot be changed.")
        write_parameter(self.scale_value, self.checked_scale(value))

    def checked_scale(self, value, argument="scale"):
        """``value`` (a number or a one-value Tensor) as a float32 NumPy scalar if it can be the scale: finite, > 0,
        with a finite reciprocal, and for a dynamic rule of ours within its ``[min_scale, max_scale]``; else a
        ``ValueError`` (``TypeError`` for a non-number) naming ``argument``. Host only, no sync but a Tensor's read.

        Example:
            >>> from lossscale.core.policy import LossScalePolicy
            >>> from lossscale.core.scaler import LossScaler
            >>> LossScaler(LossScalePolicy(init_scale=8.0, max_scale=16.0)).checked_scale(32.0)
            Traceback (most recent call last):
            ...
            ValueError: 'scale' must be within the update cell's [min_loss_scale, max_loss_scale] = [1.0, 16.0], ...
        """
        scale = positive_scale(argument, value)
        bounds = self._kind.bounds()
        if bounds is not None and not bounds[0] <= scale <= bounds[1]:
            raise ValueError(
                f"'{argument}' must be within the update cell's [min_loss_scale, max_loss_scale] = "
                f"[{bounds[0]!r}, {bounds[1]!r}], but got {float(scale)!r}."
            )
        return scale

    def set_rule(self, policy=None, state=None, dynamic=None):
        """Change a mutable rule (see ``mutable_rule``): the policy, the state and/or fixed vs dynamic. An adaptive
        window rule takes a new state (and initial scale) only."""
        self._kind.set_rule(policy, state, dynamic)

    def state_dict(self):
        """``{'loss_scale', 'good_steps', 'hysteresis_left'}`` as Python numbers (counters only for a
        dynamic rule of ours; ``good_steps`` also for MindSpore's own dynamic update cell; one host sync)."""
        return self._kind.state_dict(self)

    def load_state_dict(self, state):
        """Restore :meth:`state_dict` output (validated; nothing changes on error). A fixed update cell's or a frozen
        scale cannot change: its state must hold that scale."""
        self._kind.load_state_dict(self, state)

    def loaded_scale(self, state):
        """``state['loss_scale']`` as :meth:`checked_scale` gives it, an error naming that key."""
        return self.checked_scale(state_dict_values(state, ("loss_scale",))["loss_scale"], "state_dict['loss_scale']")
