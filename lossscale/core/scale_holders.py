"""What holds a core's scale, one small adapter each: a number or Tensor, a graph constant, lossscale's update cell
(any rule), MindSpore's own fixed or dynamic update cell, or another update Cell.

The core (:class:`lossscale.core.scaler.LossScaler`) asks its holder, chosen once (:func:`holder_of`), for the rule,
the bounds of a new scale, the state dict, a load of one (checked, nothing changed on error), a change of rule, and
whether another core adopted its update cell; it never branches on the kind.

Example:
    >>> holder = holder_of(None, frozen=False)
    >>> type(holder).__name__, holder.dynamic, holder.rule
    ('ScaleTensor', False, None)
"""

import numpy as np
from mindspore import nn

from lossscale.core._parameters import write_parameter
from lossscale.core._validation import FLOAT32_MAX, check_int_in_range
from lossscale.core.rule import FixedRule, state_dict_values
from lossscale.core.update_cells import LossScaleUpdateCell, mindspore_good_steps


class ScaleTensor:
    """A fixed scale given as a number or a Tensor: no update cell; its state is the scale, which a load writes (any
    positive finite one)."""

    dynamic = False
    rule = None

    def __init__(self, cell=None):
        self.cell = cell

    def bounds(self):
        """``(low, high)`` of a scale this holder takes."""
        return 0.0, FLOAT32_MAX

    def state_dict(self, core):
        return {"loss_scale": core.get_scale()}

    def load_state_dict(self, core, state):
        write_parameter(core.scale_value, core.checked_scale(_saved_scale(state), "state_dict['loss_scale']"))

    def check_owner(self, core):
        """RuntimeError if another core adopted this holder's update cell (only one with counters matters)."""

    def set_rule(self, rule, state, dynamic):
        """Change the rule, the state and/or fixed vs dynamic: only a mutable update cell can."""
        raise RuntimeError("set_rule() needs a LossScaler built with mutable_rule=True.")


class FrozenScale(ScaleTensor):
    """A fixed scale held as a graph constant (the optimizer divides by it): its state must hold that scale."""

    def __init__(self, cell, scale):
        super().__init__(cell)
        self.scale = scale

    def bounds(self):
        return self.scale, self.scale

    def load_state_dict(self, core, state):
        FixedRule(self.scale).check_state({"scale": _saved_scale(state)})


class MindSporeFixedCell(ScaleTensor):
    """MindSpore's own fixed update cell: its state must hold its scale, which a load writes back."""

    def bounds(self):
        scale = float(np.float32(self.cell.get_loss_scale()))
        return scale, scale

    def load_state_dict(self, core, state):
        FixedRule(self.cell.get_loss_scale()).check_state({"scale": _saved_scale(state)})
        write_parameter(core.scale_value, np.float32(self.cell.get_loss_scale()))


class OtherCell(ScaleTensor):
    """Another update Cell: dynamic unless it says otherwise (``dynamic``); its state is the scale."""

    @property
    def dynamic(self):
        return getattr(self.cell, "dynamic", True)


class RuleCell(ScaleTensor):
    """lossscale's update cell of any rule: the rule's bounds and state, one owner, and a mutable rule's changes."""

    @property
    def dynamic(self):
        return self.cell.dynamic

    @property
    def rule(self):
        return self.cell.rule

    def bounds(self):
        return self.cell.rule.scale_bounds()

    def state_dict(self, core):
        return self.cell.state_dict()

    def load_state_dict(self, core, state):
        self.cell.load_state_dict(state)

    def set_rule(self, rule, state, dynamic):
        if not self.cell.mutable:
            super().set_rule(rule, state, dynamic)
        if rule is not None or state is not None:
            self.cell.set_rule(rule or self.cell.rule, state)
        if dynamic is not None:
            self.cell.set_dynamic(dynamic)

    def check_owner(self, core):
        owner = self.cell.scale_parameter
        shares_counters = bool(self.cell.rule.fields)  # cells may share a rule without counters (a fixed scale)
        if shares_counters and owner is not None and owner is not core.scale_value:
            raise RuntimeError(
                f"this train cell's update cell ({type(self.cell).__name__}) was adopted by another train cell since: "
                f"one update cell holds one scale's counters, and two cells using it would change each other's "
                f"scales. Give each train cell its own update cell (manager.get_update_cell() makes a new one)."
            )


class MindSporeDynamicCell(ScaleTensor):
    """MindSpore's own dynamic update cell, which keeps step numbers: its clean steps in a row are the state's
    ``good_steps``, and a state holds them or the scale alone (0.1.0 kept the scale only for it)."""

    dynamic = True

    def state_dict(self, core):
        good_steps = mindspore_good_steps(self.cell.cur_iter, self.cell.last_overflow_iter)
        return {"loss_scale": core.get_scale(), "good_steps": good_steps}

    def load_state_dict(self, core, state):
        scale = core.checked_scale(_saved_scale(state), "state_dict['loss_scale']")
        good_steps = None
        if "good_steps" in state:
            value = state_dict_values(state, ("good_steps",))["good_steps"]
            good_steps = check_int_in_range("state_dict['good_steps']", value, low=0, high=self.cell.scale_window - 1)
        write_parameter(core.scale_value, scale)
        if good_steps is not None:  # its rule reads only the difference of its two step numbers
            write_parameter(self.cell.cur_iter, good_steps + 1)
            write_parameter(self.cell.last_overflow_iter, 0)


def _saved_scale(state):
    """``state['loss_scale']`` as a number (errors name the key)."""
    return state_dict_values(state, ("loss_scale",))["loss_scale"]


def holder_of(update_cell, frozen, frozen_scale=None):
    """The holder of a core's ``update_cell`` (None for a number or Tensor); ``frozen``: the scale is a graph
    constant (``frozen_scale``)."""
    if frozen:
        return FrozenScale(update_cell, frozen_scale)
    if update_cell is None:
        return ScaleTensor()
    if isinstance(update_cell, LossScaleUpdateCell):
        return RuleCell(update_cell)
    if isinstance(update_cell, nn.FixedLossScaleUpdateCell):
        return MindSporeFixedCell(update_cell)
    if isinstance(update_cell, nn.DynamicLossScaleUpdateCell):
        return MindSporeDynamicCell(update_cell)
    return OtherCell(update_cell)
