"""The kinds of rule a :class:`lossscale.core.scaler.LossScaler` can hold, one small adapter each.

What decides the scale is chosen once, when the core is built (:func:`rule_kind`): a number or Tensor (a fixed
scale, :class:`FixedScale`), a fixed update cell (ours or MindSpore's, :class:`FixedCell`), our dynamic update cell
(:class:`DynamicCell`, whose rule may switch between fixed and dynamic when it is held in Parameters),
MindFormers' adaptive-window cell (:class:`AdaptiveCell`), MindSpore's own dynamic update cell
(:class:`MindSporeDynamicCell`, which counts step numbers), any other update
Cell (:class:`ForeignCell`), and a scale held as a graph constant (:class:`FrozenScale`). The core asks its adapter
and never branches on the kind (jmp's shape: one protocol, several kinds of scale).

Each adapter answers, on the host: whether the scale is dynamic, the rule (a LossScalePolicy or None), the
``[low, high]`` a new scale must lie in, the state dict, the load of one (validated, nothing changed on error) and
whether another core has adopted its update cell.

Example:
    >>> kind = rule_kind(None, frozen=False)
    >>> type(kind).__name__, kind.dynamic, kind.policy
    ('FixedScale', False, None)
"""

import dataclasses

import numpy as np
from mindspore import nn

from lossscale.core._parameters import write_parameter
from lossscale.core._validation import FLOAT32_MAX, check_int_in_range
from lossscale.core.adaptive_cell import AdaptiveLossScaleUpdateCell
from lossscale.core.policy import state_dict_values
from lossscale.core.update_cells import (
    DynamicLossScaleUpdateCell,
    FixedLossScaleUpdateCell,
    check_fixed_state,
    mindspore_good_steps,
)


class FixedScale:
    """A fixed scale given as a number or a Tensor: no update cell; its state is the scale, and a loaded one is
    written (checked by the core)."""

    dynamic = False
    policy = None

    def __init__(self, cell=None):
        self.cell = cell

    def bounds(self):
        """``(low, high)`` of a scale this rule takes, or None for any positive finite one."""
        return None

    def state_dict(self, core):
        return {"loss_scale": core.get_scale()}

    def load_state_dict(self, core, state):
        write_parameter(core.scale_value, core.loaded_scale(state))

    def check_owner(self, core):
        """RuntimeError if another core adopted this rule's update cell (only a dynamic one holds counters)."""

    def set_rule(self, policy, state, dynamic):
        """Change the rule, the state and/or fixed vs dynamic: only a mutable rule can."""
        raise RuntimeError("set_rule() needs a LossScaler built with mutable_rule=True.")


class FixedCell(FixedScale):
    """A fixed update cell (ours or MindSpore's): its state must hold its scale, which a load writes back (over a
    scale written into the running cell since)."""

    def load_state_dict(self, core, state):
        check_fixed_state(state, self.cell.loss_scale_value)
        write_parameter(core.scale_value, np.float32(self.cell.loss_scale_value))


class FrozenScale(FixedScale):
    """A fixed scale held as a graph constant (the optimizer divides by it): its state must hold that scale."""

    def __init__(self, cell, scale):
        super().__init__(cell)
        self.scale = scale

    def load_state_dict(self, core, state):
        check_fixed_state(state, self.scale)


class ForeignCell(FixedScale):
    """Another update Cell: dynamic unless it says otherwise (``dynamic``); its state is the scale."""

    @property
    def dynamic(self):
        return getattr(self.cell, "dynamic", True)


class DynamicCell(FixedScale):
    """Our dynamic update cell: its rule (switchable between fixed and dynamic when held in Parameters), its
    bounds, its counters in the state, and one owner."""

    @property
    def dynamic(self):
        return self.cell.dynamic

    @property
    def policy(self):
        return self.cell.policy

    def bounds(self):
        return self.cell.policy.floor, self.cell.policy.ceiling

    def state_dict(self, core):
        return self.cell.state_dict()

    def load_state_dict(self, core, state):
        self.cell.load_state_dict(state)

    def set_rule(self, policy, state, dynamic):
        if not self.cell.mutable_rule:
            super().set_rule(policy, state, dynamic)
        if policy is not None or state is not None:
            self.cell.set_policy(policy or self.cell.policy, state)
        if dynamic is not None:
            self.cell.set_dynamic(dynamic)

    def check_owner(self, core):
        owner = self.cell.scale_parameter
        if owner is not None and owner is not core.scale_value:
            raise RuntimeError(
                f"this train cell's update cell ({type(self.cell).__name__}) was adopted by "
                f"another train cell since: one update cell holds one scale's counters, and two "
                f"cells using it would change each other's scales. Give each train cell its own "
                f"update cell (manager.get_update_cell() makes a new one at each call)."
            )


class AdaptiveCell(DynamicCell):
    """MindFormers' adaptive update cell: its rule (an AdaptiveWindowRule), scales in ``[1, float32 max]``, its
    window state in the state dict, and one owner."""

    @property
    def policy(self):
        return self.cell.rule

    def bounds(self):
        return 1.0, FLOAT32_MAX

    def set_rule(self, policy, state, dynamic):
        """A new state (an AdaptiveState); the rule may change its initial scale only, and is always dynamic: its
        levels and factor are constants of the update graph."""
        rule = self.cell.rule
        if dynamic is False:
            raise ValueError("MindFormers' adaptive window rule is always dynamic: it cannot hold a fixed scale.")
        if policy is not None and dataclasses.replace(policy, init_scale=rule.init_scale) != rule:
            raise ValueError(
                f"this adaptive window rule's factor and window levels are fixed when it is built ({rule}), but got "
                f"{policy}: build another with that rule."
            )
        if state is not None:
            self.cell.set_state(state)


class MindSporeDynamicCell(FixedScale):
    """MindSpore's own dynamic update cell, which keeps step numbers: its clean steps in a row are the state's
    ``good_steps``, and a state holds them or the scale alone (0.1.0 kept the scale only for it)."""

    dynamic = True

    def state_dict(self, core):
        good_steps = mindspore_good_steps(self.cell.cur_iter, self.cell.last_overflow_iter)
        return {"loss_scale": core.get_scale(), "good_steps": good_steps}

    def load_state_dict(self, core, state):
        scale = core.loaded_scale(state)
        good_steps = None
        if "good_steps" in state:
            value = state_dict_values(state, ("good_steps",))["good_steps"]
            good_steps = check_int_in_range("state_dict['good_steps']", value, low=0, high=self.cell.scale_window - 1)
        write_parameter(core.scale_value, scale)
        if good_steps is not None:  # its rule reads only the difference of its two step numbers
            write_parameter(self.cell.cur_iter, good_steps + 1)
            write_parameter(self.cell.last_overflow_iter, 0)


def rule_kind(update_cell, frozen, frozen_scale=None):
    """The adapter of a core's ``update_cell`` (None for a number or Tensor rule); ``frozen``: the scale is a graph
    constant (``frozen_scale``)."""
    if frozen:
        return FrozenScale(update_cell, frozen_scale)
    if update_cell is None:
        return FixedScale()
    if isinstance(update_cell, DynamicLossScaleUpdateCell):
        return DynamicCell(update_cell)
    if isinstance(update_cell, AdaptiveLossScaleUpdateCell):
        return AdaptiveCell(update_cell)
    if isinstance(update_cell, (FixedLossScaleUpdateCell, nn.FixedLossScaleUpdateCell)):
        return FixedCell(update_cell)
    if isinstance(update_cell, nn.DynamicLossScaleUpdateCell):
        return MindSporeDynamicCell(update_cell)
    return ForeignCell(update_cell)
