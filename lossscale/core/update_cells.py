"""Update cells: a rule (:mod:`lossscale.core.rule`) in a graph, with MindSpore's call contract.

``cell(loss_scale_parameter, overflow) -> overflow``, once per step inside the compiled train graph: the rule's
update applied to the scale Parameter (owned by the train cell) and to the cell's counter Parameters, written with
``ops.assign``; never a host sync. :class:`LossScaleUpdateCell` drives any rule; ``FixedLossScaleUpdateCell``
and ``DynamicLossScaleUpdateCell`` are MindSpore's names and arguments for the fixed and the dynamic rule.

Example:
    >>> from lossscale.core.rule import FixedRule
    >>> LossScaleUpdateCell(FixedRule(1024.0)).state_dict()
    {'loss_scale': 1024.0}
"""

import numpy as np
from mindspore import Parameter, ParameterTuple, Tensor, nn, ops
from mindspore.common import dtype as mstype
from mindspore.ops import constexpr

from lossscale.core._naming import check_name
from lossscale.core._parameters import host_array, outside_graph, read_scalar, write_parameter
from lossscale.core._validation import check_bool, check_real, read_only
from lossscale.core.rule import (
    SCALE,
    VIEW,
    FixedRule,
    LossScaleRule,
    as_mapping,
    from_state_dict,
    host_state,
    host_view,
    to_state_dict,
)
from lossscale.core.spelling import MINDSPORE_CELL, errors_named

_DTYPES = {"float32": mstype.float32, "int32": mstype.int32}
_OVERFLOW_MEANING = "True: back off; the decision, such as LossScaler.is_overflow(flag) of the check's float flag"


def check_overflow_argument(overflow):
    """TypeError, while tracing (no graph op), unless ``overflow`` is a bool Tensor holding one value: an update cell's
    call contract is ``cell(loss_scale, overflow)`` with the train cell's decision. (MindSpore's own error for a
    float flag or a Python bool names a ``Select`` kernel; a flag of several values fails later, in an ``Assign``.)

    Example:
        >>> check_overflow_argument(Tensor(True))
        True
    """
    if not isinstance(overflow, Tensor):
        raise TypeError(f"'overflow' must be a bool Tensor ({_OVERFLOW_MEANING}), but got {type(overflow).__name__}.")
    return _refuse_overflow_kind(ops.dtype(overflow), ops.shape(overflow))


@constexpr
def _refuse_overflow_kind(dtype, shape):
    if dtype != mstype.bool_ or int(np.prod(shape)) != 1:
        raise TypeError(
            f"'overflow' must be a bool Tensor holding one value ({_OVERFLOW_MEANING}), but got a Tensor "
            f"of dtype {dtype} and shape {tuple(shape)}."
        )
    return True


def check_rule(rule, argument="rule"):
    """``rule`` if it implements :class:`lossscale.core.rule.LossScaleRule`; ``TypeError`` naming ``argument``."""
    if not isinstance(rule, LossScaleRule):
        raise TypeError(
            f"'{argument}' must be a loss-scale rule (a lossscale.core.rule.LossScaleRule, such as "
            f"LossScalePolicy or lossscale.get_preset(name)), but got {type(rule).__name__}."
        )
    return rule


def _one_value(name, parameter):
    """TypeError unless ``parameter`` is a Tensor holding one value (what a scale or counter Parameter must be)."""
    if not isinstance(parameter, Tensor) or parameter.size != 1:
        shown = f"shape {parameter.shape}" if isinstance(parameter, Tensor) else type(parameter).__name__
        raise TypeError(f"'{name}' must be a Parameter holding one value, but got {shown}.")
    return parameter


class _Binding:
    """The train cell's scale Parameter (and accumulation micro-step), held outside the Cell attribute machinery so
    that they are not registered twice in the network's parameter tree (they belong to the train cell)."""

    __slots__ = ("parameter", "micro_step")

    def __init__(self):
        self.parameter = self.micro_step = None


class LossScaleUpdateCell(nn.Cell):
    """Update cell of any rule: ``cell(loss_scale, overflow, statistics=()) -> overflow``.

    Args:
        rule (LossScaleRule): the rule (:mod:`lossscale.core.rule`).
        mutable (bool): hold the rule's settings and a dynamic/fixed switch in Parameters, so that
            :meth:`set_rule` and :meth:`set_dynamic` reach graphs compiled before them (the front-ends' setters
            need it). Default False: the settings are constants of the compiled graph.

    The counters are Parameters named as the rule's :class:`StateField` says (saved in the train cell's
    checkpoint); the scale is the train cell's.

    Example:
        >>> from lossscale.core.policy import LossScalePolicy
        >>> cell = LossScaleUpdateCell(LossScalePolicy(init_scale=8.0, growth_interval=2))
        >>> scale = Parameter(Tensor(np.float32(8.0)), name="doc_scale")
        >>> _ = cell(scale, Tensor(True))
        >>> float(scale.asnumpy()), cell.state_dict()["good_steps"]
        (4.0, 0)
    """

    rule = read_only(
        "rule", "a compiled step keeps its rule: build a new cell, or one with mutable=True and set_rule()."
    )
    mutable = read_only("mutable", "whether the rule's settings are Parameters is fixed when the cell is built.")
    # MindSpore's get_loss_scale() returns this attribute, so assigning it there changes the scale a train cell
    # built afterwards starts from; ours keeps the validated value apart, where an assignment would change nothing.
    loss_scale_value = read_only(
        "loss_scale_value",
        "it is the initial scale as given. Build a new cell with the scale wanted (a train cell's set_sense_scale() "
        "changes its current scale).",
    )

    def __init__(self, rule, *, mutable=False, loss_scale_value=None):
        super().__init__()
        self._rule, self._mutable = check_rule(rule), check_bool("mutable", mutable)
        self._loss_scale_value = rule.init_scale if loss_scale_value is None else loss_scale_value
        self._binding = _Binding()
        start = as_mapping(rule, rule.initial_state())
        self._initial_scale = start["scale"]
        self.counters = ParameterTuple(
            Parameter(Tensor(start[field.name], _DTYPES[field.dtype]), name=field.parameter, requires_grad=False)
            for field in rule.fields
        )
        self._setting_names = tuple(rule.settings())
        self.settings = _held_settings(rule, self._mutable)
        self._dynamic = Parameter(Tensor(True), name="loss_scale_dynamic", requires_grad=False) if mutable else None

    @classmethod
    def of_rule(cls, rule, mutable=False):
        """A cell of this class holding ``rule`` (what :func:`update_cell_of` builds): the rule goes in as it is,
        never back through the class's own arguments."""
        cell = cls.__new__(cls)
        LossScaleUpdateCell.__init__(cell, rule, mutable=mutable)
        return cell

    @property
    def dynamic(self):
        """Whether the cell changes the scale now (a mutable cell can be switched to a fixed scale)."""
        return self._rule.dynamic and (self._dynamic is None or bool(self._dynamic.asnumpy()))

    def rename_parameters(self, prefix):
        """Name the Parameters ``<prefix>.<name>`` (``loss_scale_`` left out), so several cells can share a graph.
        Call before compiling."""
        check_name(prefix, "prefix")
        for parameter in self.get_parameters():
            parameter.name = f"{prefix}.{parameter.name.split('.')[-1].replace('loss_scale_', '', 1)}"

    # ---- binding to the train cell --------------------------------------------------------------------------
    def bind_scale_parameter(self, parameter):
        """Record the train cell's scale Parameter, so :meth:`get_loss_scale` reads the device value (the train cell
        calls it). A new adopter starts without an accumulation window."""
        self._binding.parameter, self._binding.micro_step = _one_value("parameter", parameter), None

    def bind_micro_step(self, parameter):
        """Record an accumulating train cell's micro-step counter, for :meth:`window_open`."""
        self._binding.micro_step = _one_value("parameter", parameter)

    def window_open(self):
        """Whether the train cell's last call ended inside an accumulation window (one host sync): that call decided
        nothing. False without accumulation (no sync)."""
        micro_step = self._binding.micro_step
        return micro_step is not None and read_scalar(micro_step) > 0

    scale_parameter = property(
        lambda self: self._binding.parameter,
        doc="The bound scale Parameter, or None before a train cell adopts the cell.",
    )

    def get_loss_scale(self):
        """The current scale: before a train cell adopts the cell the initial (or loaded) one, no sync; afterwards
        the device's (one host sync)."""
        parameter = self._binding.parameter
        return self._initial_scale if parameter is None else float(parameter.asnumpy().reshape(-1)[0])

    # ---- host: state ---------------------------------------------------------------------------------------
    def get_state(self):
        """The state the device holds, in the rule's form (``rule.as_state``; host reads)."""
        state = {field.name: host_array(parameter).reshape(-1)[0].item()
                 for field, parameter in zip(self._rule.fields, self.counters)}  # fmt: skip
        return self._rule.as_state(dict(state, scale=self.get_loss_scale()))

    def set_state(self, state):
        """Write a state (the rule's form or a dict), checked by the rule first."""
        mapping = self._rule.check_state(as_mapping(self._rule, state), _field_names(self._rule, "state."))
        for field, parameter in zip(self._rule.fields, self.counters):
            write_parameter(parameter, mapping[field.name])
        self._initial_scale = float(np.float32(mapping["scale"]))
        if self._binding.parameter is not None:
            write_parameter(self._binding.parameter, np.float32(mapping["scale"]))

    def state_dict(self):
        """The state under its keys (``loss_scale``, then the rule's), as Python numbers (host reads)."""
        return to_state_dict(self._rule, self.get_state())

    def load_state_dict(self, state):
        """Restore :meth:`state_dict` output, checked against the rule; nothing changes on error."""
        self.set_state(from_state_dict(self._rule, state))

    def check_loaded_state(self, scale=None, scale_name="loss_scale"):
        """``ValueError`` naming the Parameter (``scale_name`` for the scale) unless the state the device holds fits
        the rule (a checkpoint of another configuration, say). ``scale``: the train cell's (default the bound one)."""
        state = as_mapping(self._rule, self.get_state())
        state["scale"] = state["scale"] if scale is None else scale
        names = {field.name: parameter.name for field, parameter in zip(self._rule.fields, self.counters)}
        self._rule.check_state(state, dict(names, scale=scale_name))

    def read(self, name):
        """One entry of the rule's :meth:`~lossscale.core.rule.LossScaleRule.view` (``growth_interval``,
        ``good_steps``, ...): eagerly a Python number (host reads), inside a compiled function a graph read; None for
        a rule without a view."""
        if name not in VIEW:
            raise ValueError(f"'name' must be one of {VIEW}, but got {name!r}.")
        anchor = self._binding.parameter
        if anchor is None or outside_graph(anchor):
            view = host_view(self._rule, self.get_state())
            return None if view is None else view[name]
        view = self._rule.view(*_graph_state(self, anchor))
        return None if view is None else view[VIEW.index(name)]

    # ---- host: a mutable rule -----------------------------------------------------------------------------------
    def set_rule(self, rule, state=None):
        """Switch to ``rule`` (of this cell's structure, ``rule.structure()``) and ``state`` (default: the current
        one within the new rule's bounds). Checked first: nothing changes on error."""
        refuse_immutable(self.mutable, "set_rule()")
        if not isinstance(rule, type(self._rule)) or rule.structure() != self._rule.structure():
            raise ValueError(
                f"'rule' must have this update cell's structure ({self._rule.structure()!r}: it is compiled into the "
                f"graph), but got {check_rule(rule)!r}."
            )
        state = as_mapping(rule, state if state is not None else rule.within(self.get_state()))
        rule.check_state(state, _field_names(rule, "state."))
        self._rule = rule
        for name, parameter in zip(self._setting_names, self.settings):
            write_parameter(parameter, rule.settings()[name])
        self.set_state(state)

    def set_dynamic(self, dynamic):
        """Turn the update on or off (a mutable cell only)."""
        refuse_immutable(self.mutable, "set_dynamic()")
        write_parameter(self._dynamic, check_bool("dynamic", dynamic))

    def dynamic_flag(self):
        """Graph: the bool saying whether the cell updates the scale now."""
        return self._dynamic if self._dynamic is not None else Tensor(self._rule.dynamic)

    # ---- graph ---------------------------------------------------------------------------------------------
    def construct(self, loss_scale, overflow, statistics=()):
        check_overflow_argument(overflow)
        new = self._rule.update(overflow.reshape(()), statistics, *_graph_state(self, loss_scale))
        old = (loss_scale.reshape(()),) + tuple(self.counters)
        targets = (loss_scale,) + tuple(self.counters)
        for index in range(len(targets)):
            value = new[index]
            if self._dynamic is not None:  # switched to a fixed scale: nothing moves
                value = ops.select(self._dynamic, value, old[index])
            value = ops.cast(value, ops.dtype(targets[index])).reshape(targets[index].shape)
            overflow = ops.depend(overflow, ops.assign(targets[index], value))
        return overflow


def _held_settings(rule, mutable):
    """The rule's settings as float32/int32 Tensors: constants of the graph, or Parameters for a ``mutable`` cell."""
    values = []
    held = host_state(rule, rule.initial_state())[1 + len(rule.fields) :]
    for name, value in zip(rule.settings(), held):
        tensor = Tensor(value, _DTYPES[str(value.dtype)])
        values.append(Parameter(tensor, name=f"loss_scale_{name}", requires_grad=False) if mutable else tensor)
    return ParameterTuple(values) if mutable else tuple(values)


def _graph_state(cell, loss_scale):
    """The state as ``cell``'s graph reads it, in the rule's order: the scale, the counters and the settings, each a
    scalar Tensor (a tuple: see :mod:`lossscale.core.rule`)."""
    return (loss_scale.reshape(()),) + tuple(cell.counters) + tuple(cell.settings)


def refuse_immutable(mutable, method):
    """RuntimeError unless the update cell is ``mutable`` (``method`` changes its rule)."""
    if not mutable:
        raise RuntimeError(f"{method} needs an update cell built with mutable_rule=True.")


def _field_names(rule, prefix):
    """``{name: prefix + name}`` of ``rule``'s state (what its errors call each entry)."""
    return {name: f"{prefix}{name}" for name in (SCALE.name, *(field.name for field in rule.fields))}


class FixedLossScaleUpdateCell(LossScaleUpdateCell):
    """Update cell with a constant loss scale (MindSpore's name): the flag passes through, the scale stays.

    Args:
        loss_scale_value (float): the scale, finite and > 0.

    Example:
        >>> FixedLossScaleUpdateCell(1024.0).get_loss_scale()
        1024.0
    """

    def __init__(self, loss_scale_value):
        check_real("loss_scale_value", loss_scale_value)
        with errors_named(MINDSPORE_CELL):
            rule = FixedRule(init_scale=loss_scale_value)
        super().__init__(rule, loss_scale_value=loss_scale_value)

    @classmethod
    def of_rule(cls, rule, mutable=False):
        return super().of_rule(rule)  # a fixed scale has nothing to change


def update_cell_of(rule, mutable=False):
    """The update cell of ``rule``: the class its kind names (``rule.cell_class``: MindSpore's or MindFormers' cell
    for their rules), else :class:`LossScaleUpdateCell`.

    Example:
        >>> type(update_cell_of(FixedRule(8.0))).__name__
        'FixedLossScaleUpdateCell'
    """
    return getattr(check_rule(rule), "cell_class", LossScaleUpdateCell).of_rule(rule, mutable)


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


FixedRule.cell_class = FixedLossScaleUpdateCell
