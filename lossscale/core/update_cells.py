"""Graph-mode loss-scale update cells (MindSpore's call contract, our policy).

An update cell is called once per step inside the compiled train graph as
``cell(loss_scale_parameter, overflow) -> overflow``: it updates the scale
Parameter (owned by the train cell) and its own counter Parameters with
``ops.assign``. It never syncs with the host inside the graph.

:class:`DynamicLossScaleUpdateCell` implements :func:`lossscale.core.policy.update`
with branch-free ``select`` ops; the tests check it equals the policy step for step.
"""

import dataclasses

import numpy as np
from mindspore import Parameter, Tensor, nn, ops
from mindspore.common import dtype as mstype
from mindspore.ops import constexpr

from lossscale.core._naming import check_name
from lossscale.core._parameters import host_array, read_scalar, write_parameter
from lossscale.core._validation import check_bool, check_real, positive_float32, read_only
from lossscale.core.policy import (
    FLOAT32_TINY,
    LossScalePolicy,
    LossScaleState,
    check_state,
    initial_state,
    policy_extensions,
    policy_from_mindspore_arguments,
    state_dict_values,
    state_from_dict,
)

# The policy fields whose numbers the cell holds as they are (min/max are held rounded to float32).
_RULE_ATTRIBUTES = {
    "growth_factor": "_growth_factor",
    "backoff_factor": "_backoff_factor",
    "growth_interval": "_window",
    "hysteresis": "_full_hysteresis",
}

# The rule's numbers as the cell holds them: (attribute, policy field, dtype); graph constants, or Parameters when
# the rule is mutable.
_HELD_NUMBERS = (
    ("_growth_factor", "growth_factor", mstype.float32),
    ("_backoff_factor", "backoff_factor", mstype.float32),
    ("_min_scale", "floor", mstype.float32),
    ("_max_scale", "ceiling", mstype.float32),
    ("_window", "growth_interval", mstype.int32),
    ("_full_hysteresis", "hysteresis", mstype.int32),
)


def _counter(name, value):
    """An int32 counter Parameter of the update rule (saved in checkpoints, never trained)."""
    return Parameter(Tensor(value, mstype.int32), name=name, requires_grad=False)


class _ScaleBinding:
    """Holds the train cell's scale Parameter (and its accumulation micro-step) outside the Cell attribute machinery.

    Stored as a plain object so the Parameters are not registered twice in the
    network's parameter tree (they belong to the train cell).
    """

    __slots__ = ("parameter", "micro_step")

    def __init__(self, parameter):
        self.parameter = parameter
        self.micro_step = None


def check_overflow_argument(overflow):
    """TypeError, while tracing (no graph op), unless ``overflow`` is a bool Tensor holding one value: an update cell's
    call contract is ``cell(loss_scale, overflow)`` with the train cell's decision. MindSpore's own error for a float
    flag or a Python bool names a ``Select`` kernel; a flag of several values fails later, in an ``Assign``.

    Example:
        >>> check_overflow_argument(Tensor(True))
        True
    """
    if not isinstance(overflow, Tensor):
        raise TypeError(f"'overflow' must be a bool Tensor ({_OVERFLOW_MEANING}), but got {type(overflow).__name__}.")
    return _refuse_overflow_kind(ops.dtype(overflow), ops.shape(overflow))


_OVERFLOW_MEANING = "True: back off; the decision, such as LossScaler.is_overflow(flag) of the check's float flag"


@constexpr
def _refuse_overflow_kind(dtype, shape):
    if dtype != mstype.bool_ or int(np.prod(shape)) != 1:
        raise TypeError(
            f"'overflow' must be a bool Tensor holding one value ({_OVERFLOW_MEANING}), but got a Tensor "
            f"of dtype {dtype} and shape {tuple(shape)}."
        )
    return True


def _check_one_value_parameter(name, parameter):
    """TypeError unless ``parameter`` is a Parameter (or, for a frozen scale, a Tensor) holding one value: anything
    else would be accepted here and fail at the next read of the state."""
    if not isinstance(parameter, Tensor) or parameter.size != 1:
        shown = f"shape {parameter.shape}" if isinstance(parameter, Tensor) else type(parameter).__name__
        raise TypeError(f"'{name}' must be a Parameter holding one value, but got {shown}.")


class _UpdateCellBase(nn.Cell):
    """Shared plumbing: the initial scale and the binding to the train cell's scale Parameter."""

    # MindSpore's get_loss_scale() returns this attribute, so assigning it there changes the scale a train cell
    # built afterwards starts from; ours keeps the validated value apart, where an assignment would change nothing.
    loss_scale_value = read_only(
        "loss_scale_value",
        "it is the initial scale as given. Build a new cell with the "
        "scale wanted (a train cell's set_sense_scale() changes its "
        "current scale).",
    )

    def __init__(self, loss_scale_value):
        super().__init__()
        self._loss_scale_value = loss_scale_value
        self._initial_scale = float(np.float32(loss_scale_value))
        self._binding = _ScaleBinding(None)

    def bind_scale_parameter(self, parameter):
        """Record the train cell's scale Parameter so :meth:`get_loss_scale` reads the device value.

        Called by :class:`lossscale.TrainOneStepWithLossScaleCell`; users need not call it. A new
        adopter starts without an accumulation window (see :meth:`bind_micro_step`).
        """
        _check_one_value_parameter("parameter", parameter)
        self._binding.parameter = parameter
        self._binding.micro_step = None

    def bind_micro_step(self, parameter):
        """Record the accumulating train cell's micro-step counter, for :meth:`window_open`.

        Called by :class:`lossscale.TrainOneStepWithLossScaleCell` with ``accumulation_steps > 1``.
        """
        _check_one_value_parameter("parameter", parameter)
        self._binding.micro_step = parameter

    def window_open(self):
        """Whether the train cell's last call ended inside an accumulation window (one host sync).

        Such a call decided nothing (this cell did not run), so its overflow output (False) is not a
        clean step: the manager's MindSpore counters skip it. False without accumulation (no sync).
        """
        micro_step = self._binding.micro_step
        return micro_step is not None and read_scalar(micro_step) > 0

    @property
    def scale_parameter(self):
        """The bound scale Parameter, or None before a train cell has adopted this update cell."""
        return self._binding.parameter

    def get_loss_scale(self):
        """The current loss scale as a float.

        Before a train cell adopts this cell: the initial (or loaded) scale, no sync.
        Afterwards: the value the device holds (one host sync).
        """
        parameter = self._binding.parameter
        if parameter is None:
            return self._initial_scale
        return float(parameter.asnumpy().reshape(-1)[0])

    def _set_loss_scale(self, value):
        self._initial_scale = float(np.float32(value))
        parameter = self._binding.parameter
        if parameter is not None:
            write_parameter(parameter, np.float32(value))


def check_fixed_state(state, fixed_scale, name="state_dict['loss_scale']"):
    """A fixed scale's saved state, ``{'loss_scale': S}``, must hold exactly that scale (in float32); the error
    names the value as ``name``."""
    saved = state_dict_values(state, ("loss_scale",))["loss_scale"]
    if float(np.float32(saved)) != float(np.float32(fixed_scale)):
        raise ValueError(f"'{name}' must equal the fixed loss scale {float(fixed_scale)!r}, but got {saved!r}.")


def mindspore_good_steps(current_step, last_overflow_step):
    """The clean steps in a row of MindSpore's own dynamic update cell, which keeps step numbers instead: its
    current step (from 1) and that of its last backoff or growth, as Tensors or Parameters (its ``cur_iter`` and
    ``last_overflow_iter``, saved as ``current_iterator_step`` and ``last_overflow_iterator_step``; one host sync).

    Example:
        >>> mindspore_good_steps(Tensor(np.array([7], np.int32)), Tensor(np.array([4], np.int32)))
        2
    """
    current, last = (int(host_array(step).reshape(-1)[0]) for step in (current_step, last_overflow_step))
    return current - last - 1


class FixedLossScaleUpdateCell(_UpdateCellBase):
    """Update cell with a constant loss scale: the overflow flag passes through.

    Args:
        loss_scale_value (float): the scale, finite and > 0.

    Inputs:
        - **loss_scale** (Parameter) - ignored.
        - **overflow** (Tensor[bool]) - whether the gradients overflowed.

    Outputs:
        The ``overflow`` input, unchanged (the train cell skips the step on True).

    Example:
        >>> cell = FixedLossScaleUpdateCell(1024.0)
        >>> cell.get_loss_scale()
        1024.0
    """

    def __init__(self, loss_scale_value):
        check_real("loss_scale_value", loss_scale_value)
        positive_float32("loss_scale_value", loss_scale_value)
        super().__init__(loss_scale_value)

    def state_dict(self):
        """``{'loss_scale': float}``; syncs the host if bound to a train cell."""
        return {"loss_scale": self.get_loss_scale()}

    def load_state_dict(self, state):
        """Check :meth:`state_dict` output: its scale must equal this cell's fixed scale."""
        check_fixed_state(state, self.loss_scale_value)

    def check_loaded_state(self, scale=None, scale_name="loss_scale"):
        """``ValueError`` naming ``scale_name`` unless ``scale`` (default the bound one) is this cell's scale."""
        check_fixed_state(
            {"loss_scale": self.get_loss_scale() if scale is None else scale}, self.loss_scale_value, name=scale_name
        )

    def construct(self, loss_scale, overflow):
        check_overflow_argument(overflow)
        return overflow


# MindSpore's update cell reads scale_factor/scale_window when it compiles, so assigning them before the first step
# changes its rule; ours holds the validated rule in Tensors, where an assigned attribute would change nothing.
_CELL_ADVICE = (
    "the validated rule is held in the cell's Tensors. Build a new cell (or "
    "DynamicLossScaleUpdateCell.from_policy(policy))."
)


class DynamicLossScaleUpdateCell(_UpdateCellBase):
    """Dynamic loss-scale update cell: :func:`lossscale.core.policy.update` in graph mode.

    Same constructor positional arguments and call contract as
    ``mindspore.nn.DynamicLossScaleUpdateCell``, plus keyword extensions. The scale
    grows by ``scale_factor`` on the ``scale_window``-th consecutive clean step
    (never to inf, never above ``max_loss_scale``), backs off by ``backoff_factor``
    on the ``hysteresis``-th overflow, and never drops below ``min_loss_scale``.

    State lives in Parameters saved with the network's checkpoint:
    ``<prefix>loss_scale_good_steps`` (int32, always < ``scale_window``) and
    ``<prefix>loss_scale_hysteresis_left`` (int32, in [1, hysteresis]); the scale
    itself is the train cell's ``scale_sense`` Parameter.

    Args:
        loss_scale_value (float): initial scale.
        scale_factor (float): growth factor, > 1 (backoff is its reciprocal by default).
        scale_window (int): clean steps before a growth, >= 1.
        backoff_factor (float, optional): multiplier on backoff, in (0, 1).
        hysteresis (int): overflows needed to back off once, >= 1. Default 1.
        consecutive_hysteresis (bool): refill hysteresis on any clean step (True)
            or only on growth (False, default).
        min_loss_scale (float): floor, >= 0. Default 1.0 (MindSpore's floor).
        max_loss_scale (float, optional): ceiling; default the largest float32.
        mutable_rule (bool): hold the rule's numbers (factors, bounds, window, hysteresis) and a
            dynamic/fixed switch in Parameters, so that :meth:`set_policy` and :meth:`set_dynamic` reach
            graphs compiled before them (what :class:`lossscale.GradScaler`'s setters need). Default
            False: the rule is a constant of the compiled graph.

    Inputs:
        - **loss_scale** (Parameter) - float32 scale of shape () or (1,), updated in place.
        - **overflow** (Tensor[bool]) - whether this step's gradients overflowed.

    Outputs:
        The ``overflow`` input.

    Example:
        >>> cell = DynamicLossScaleUpdateCell(2**12, 2, 1000, hysteresis=2)
        >>> cell.policy.backoff_factor
        0.5
    """

    scale_factor = read_only("scale_factor", _CELL_ADVICE)
    scale_window = read_only("scale_window", _CELL_ADVICE)
    policy = read_only(
        "policy",
        "a compiled step keeps the rule it was built with. Build the cell with mutable_rule=True "
        "and call set_policy(policy), or build a new cell (from_policy(policy)).",
    )
    mutable_rule = read_only("mutable_rule", "whether the rule is held in Parameters is fixed when the cell is built.")

    def __init__(
        self,
        loss_scale_value,
        scale_factor,
        scale_window,
        *,
        backoff_factor=None,
        hysteresis=1,
        consecutive_hysteresis=False,
        min_loss_scale=1.0,
        max_loss_scale=None,
        refill_hysteresis_on_backoff=False,
        mutable_rule=False,
    ):
        policy = policy_from_mindspore_arguments(
            "loss_scale_value",
            loss_scale_value,
            scale_factor,
            scale_window,
            backoff_factor=backoff_factor,
            hysteresis=hysteresis,
            consecutive_hysteresis=consecutive_hysteresis,
            min_loss_scale=min_loss_scale,
            max_loss_scale=max_loss_scale,
            refill_hysteresis_on_backoff=refill_hysteresis_on_backoff,
        )
        super().__init__(loss_scale_value)
        self._policy = policy
        self._scale_factor, self._scale_window = scale_factor, scale_window
        self._mutable_rule = check_bool("mutable_rule", mutable_rule)
        for attribute, field, dtype in _HELD_NUMBERS:
            setattr(self, attribute, self._rule_number(attribute, Tensor(getattr(policy, field), dtype)))
        if mutable_rule:
            self._dynamic = self._rule_number("_dynamic", Tensor(True, mstype.bool_))
        self._tiny = Tensor(FLOAT32_TINY, mstype.float32)
        self._zero, self._one = Tensor(0, mstype.int32), Tensor(1, mstype.int32)
        self._consecutive = policy.consecutive_hysteresis
        start = initial_state(policy)
        self.good_steps = _counter("loss_scale_good_steps", start.good_steps)
        self.hysteresis_left = _counter("loss_scale_hysteresis_left", start.hysteresis_left)

    def rename_parameters(self, prefix):
        """Name this cell's Parameters ``<prefix>.good_steps``, ``<prefix>.hysteresis_left`` (and the
        rule's, once held in Parameters), so several cells can live in one graph. Call before compiling."""
        check_name(prefix, "prefix")
        for attribute, parameter in self.parameters_and_names():
            parameter.name = f"{prefix}.{attribute.split('.')[-1].lstrip('_')}"

    def _rule_number(self, attribute, value):
        """One of the rule's numbers: a Parameter (``loss_scale_<attribute>``) when the rule is mutable, else a
        constant of the graph."""
        if not self._mutable_rule:
            return value
        return Parameter(value, name=f"loss_scale{attribute}", requires_grad=False)

    def rule_value(self, field):
        """The rule's ``field`` (``growth_factor``, ``backoff_factor``, ``growth_interval`` or ``hysteresis``):
        eagerly the policy's exact Python number; inside a compiled function, once the rule is held in
        Parameters, a graph read of its Parameter (so :meth:`set_policy` after compiling shows there too).

        Example:
            >>> DynamicLossScaleUpdateCell(2**12, 2, 1000, hysteresis=2).rule_value("hysteresis")
            2
        """
        if field not in _RULE_ATTRIBUTES:
            raise ValueError(f"'field' must be one of {tuple(_RULE_ATTRIBUTES)}, but got {field!r}.")
        return read_scalar(getattr(self, _RULE_ATTRIBUTES[field]), host_value=getattr(self._policy, field))

    def dynamic_flag(self):
        """Graph: the bool Parameter saying whether the cell updates the scale now (a mutable rule only)."""
        return self._dynamic

    @property
    def dynamic(self):
        """Whether the cell updates the scale (always True unless the rule is mutable)."""
        return bool(self._dynamic.asnumpy()) if self._mutable_rule else True

    def set_dynamic(self, dynamic):
        """Turn the update on or off (a cell built with ``mutable_rule=True`` only)."""
        if not self._mutable_rule:
            raise RuntimeError("set_dynamic() needs an update cell built with mutable_rule=True.")
        write_parameter(self._dynamic, check_bool("dynamic", dynamic))

    def set_policy(self, policy, state=None):
        """Switch to ``policy`` (same structural flags) keeping, or replacing with ``state``, the state.

        Validated first: nothing changes on error. Without a ``state`` the current one is kept
        and clipped to the new bounds (counters to the new window and hysteresis).
        """
        if not self._mutable_rule:
            raise RuntimeError("set_policy() needs an update cell built with mutable_rule=True.")
        if not isinstance(policy, LossScalePolicy):
            raise TypeError(
                f"'policy' must be a LossScalePolicy (lossscale.get_preset(name) gives one by name), "
                f"but got {type(policy).__name__}."
            )
        if (policy.consecutive_hysteresis, policy.refill_hysteresis_on_backoff) != (
            self._policy.consecutive_hysteresis,
            self._policy.refill_hysteresis_on_backoff,
        ):
            raise ValueError(
                "'policy' must keep the hysteresis mode of this update cell "
                "(consecutive_hysteresis, refill_hysteresis_on_backoff)."
            )
        if state is None:
            current = self.get_state()
            state = LossScaleState(
                scale=current.scale,
                good_steps=min(current.good_steps, policy.growth_interval - 1),
                hysteresis_left=min(current.hysteresis_left, policy.hysteresis),
            )
        check_state(policy, state)
        self._policy = policy
        self._scale_factor, self._scale_window = policy.growth_factor, policy.growth_interval
        for attribute, field, _ in _HELD_NUMBERS:
            write_parameter(getattr(self, attribute), getattr(policy, field))
        self.set_state(state)

    def _state_within_rule(self, loss_scale):
        """The scale and counters brought back within the rule: a loaded state outside it (a checkpoint of
        another configuration, or MindSpore's inf scale) would otherwise never recover (``inf * 0.5`` is
        inf). A scale that is not finite restarts from the ceiling and backs off from there; others are
        clipped to [min_loss_scale, max_loss_scale] (with no floor, 0 is a state the rule itself reaches).
        Valid states pass through unchanged; the train cell refuses an invalid one before its first step."""
        bounded = ops.minimum(ops.maximum(loss_scale, self._min_scale), self._max_scale)
        scale = ops.select(ops.isfinite(loss_scale), bounded, ops.broadcast_to(self._max_scale, ops.shape(loss_scale)))
        good_steps = ops.minimum(ops.maximum(self.good_steps, self._zero), self._window - self._one)
        hysteresis = ops.minimum(ops.maximum(self.hysteresis_left, self._one), self._full_hysteresis)
        return scale, good_steps, hysteresis

    @classmethod
    def from_policy(cls, policy, mutable_rule=False):
        """An update cell applying ``policy`` (e.g. a preset from :mod:`lossscale.core.presets`); ``mutable_rule``
        as in the constructor.

        Example:
            >>> from lossscale.core.presets import get_preset
            >>> DynamicLossScaleUpdateCell.from_policy(get_preset("pytorch")).get_loss_scale()
            65536.0
        """
        return cls(
            policy.init_scale,
            policy.growth_factor,
            policy.growth_interval,
            mutable_rule=mutable_rule,
            **policy_extensions(policy),
        )

    def get_state(self):
        """The current :class:`lossscale.core.policy.LossScaleState` (syncs the host)."""
        return LossScaleState(
            scale=self.get_loss_scale(),
            good_steps=int(self.good_steps.asnumpy()),
            hysteresis_left=int(self.hysteresis_left.asnumpy()),
        )

    def read_good_steps(self):
        """The clean steps counted toward the next growth: eagerly an int (one host sync), inside a compiled
        function an int32 scalar Tensor read when the graph runs."""
        return read_scalar(self.good_steps)

    def check_loaded_state(self, scale=None, scale_name="loss_scale"):
        """``ValueError`` naming the Parameter (``scale_name`` for the scale) unless the state the device holds
        fits the rule: a checkpoint of a cell with another window or hysteresis, say. ``scale``: the scale of the
        train cell being checked (default the one this cell is bound to). Host reads."""
        state = self.get_state()
        state = state if scale is None else dataclasses.replace(state, scale=scale)
        check_state(self._policy, state, names=(scale_name, self.good_steps.name, self.hysteresis_left.name))

    def set_state(self, state):
        """Write a :class:`lossscale.core.policy.LossScaleState` into the Parameters (host to device)."""
        check_state(self._policy, state)
        self._set_loss_scale(state.scale)
        write_parameter(self.good_steps, state.good_steps)
        write_parameter(self.hysteresis_left, state.hysteresis_left)

    def state_dict(self):
        """``{'loss_scale', 'good_steps', 'hysteresis_left'}`` as Python numbers (syncs the host)."""
        state = self.get_state()
        return {"loss_scale": state.scale, "good_steps": state.good_steps, "hysteresis_left": state.hysteresis_left}

    def load_state_dict(self, state):
        """Restore the output of :meth:`state_dict` (validated; nothing changes on error)."""
        self.set_state(state_from_dict(self._policy, state))

    def construct(self, loss_scale, overflow):
        check_overflow_argument(overflow)
        scale, good_steps, hysteresis = self._state_within_rule(loss_scale)
        # Overflow branch: back off only when the hysteresis is exhausted.
        backed_off = ops.maximum(scale * self._backoff_factor, self._min_scale)
        backed_off = ops.select(backed_off < self._tiny, ops.zeros_like(backed_off), backed_off)  # no subnormals
        scale_if_overflow = ops.select(hysteresis <= self._one, backed_off, scale)
        if self._policy.refill_hysteresis_on_backoff:
            hysteresis_if_overflow = ops.select(hysteresis <= self._one, self._full_hysteresis, hysteresis - self._one)
        else:
            hysteresis_if_overflow = ops.maximum(hysteresis - self._one, self._one)
        # Clean branch: grow on the window-th clean step, never to inf nor above the ceiling.
        good_steps = good_steps + self._one
        grow = good_steps >= self._window
        grown = scale * self._growth_factor
        grown = ops.select(ops.isfinite(grown), ops.minimum(grown, self._max_scale), scale)
        scale_if_clean = ops.select(grow, grown, scale)
        good_if_clean = ops.select(grow, self._zero, good_steps)
        if self._consecutive:
            hysteresis_if_clean = self._full_hysteresis
        else:
            hysteresis_if_clean = ops.select(grow, self._full_hysteresis, hysteresis)

        new_scale = ops.select(overflow, scale_if_overflow, scale_if_clean)
        new_good = ops.select(overflow, self._zero, good_if_clean)
        new_hysteresis = ops.select(overflow, hysteresis_if_overflow, hysteresis_if_clean)
        if self._mutable_rule:  # a fixed scale leaves everything as it is
            new_scale = ops.select(self._dynamic, new_scale, loss_scale)
            new_good = ops.select(self._dynamic, new_good, self.good_steps)
            new_hysteresis = ops.select(self._dynamic, new_hysteresis, self.hysteresis_left)
        overflow = ops.depend(overflow, ops.assign(loss_scale, new_scale))
        overflow = ops.depend(overflow, ops.assign(self.good_steps, new_good))
        overflow = ops.depend(overflow, ops.assign(self.hysteresis_left, new_hysteresis))
        return overflow
