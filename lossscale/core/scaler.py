"""``LossScaler``: loss scaling itself, once, for the train cell and every front-end (docs/design.md, section 0).

The core owns the scale (a float32 Parameter), what decides it (a rule's update cell, a fixed number, or another
update Cell: :mod:`lossscale.core.scale_holders`) and the backend's overflow check. Graph methods run eagerly,
inside ``construct`` and inside ``mindspore.jit``::

    scaled = core.scale(outputs)          # each loss promoted to >= float32, times S (nan if not finite)
    grads = core.unscale(grads)           # g * (1/S) in float32 (float64 for float64 g), in g's dtype
    flag = core.flag(status, grads)       # float32, 0 when this rank's gradients are finite
    overflow = core.is_overflow(flag)     # all-reduced first in any parallel mode: ranks agree
    measured = core.statistics(grads)     # what the rule reads of the gradients, if anything (all-reduced)
    core.adjust(overflow=overflow, statistics=measured)   # the rule: back off / grow (no-op for a fixed scale)

Host methods: ``get_scale``, ``set_scale``, ``state_dict``, ``load_state_dict``, ``set_rule``.
"""

import numbers

import numpy as np
from mindspore import Parameter, Tensor, nn, ops
from mindspore.common import dtype as mstype
from mindspore.communication.management import GlobalComm
from mindspore.ops import constexpr

from lossscale.core import gradients
from lossscale.core._naming import check_name
from lossscale.core._parameters import outside_graph, read_scalar, write_parameter
from lossscale.core._validation import check_bool, positive_float32, read_only
from lossscale.core._warnings import warn_at_caller
from lossscale.core.compat import differentiating
from lossscale.core.overflow import initial_status, make_overflow_check
from lossscale.core.parallel import is_parallel, refuse_parallel_mode_set_after_build
from lossscale.core.rule import LossScaleRule
from lossscale.core.scale_holders import holder_of
from lossscale.core.update_cells import LossScaleUpdateCell, check_overflow_argument, update_cell_of


def positive_scale(name, value):
    """``value`` (number or Tensor) as a float32 NumPy scalar that is finite, > 0 and whose reciprocal is finite;
    else ``ValueError`` naming ``name`` (a scale of 1e-45 is > 0 but 1/S is inf).

    Example:
        >>> float(positive_scale("scale", Tensor(np.float32(8.0))))
        8.0
    """
    if isinstance(value, Tensor):
        array = value.asnumpy()
    elif isinstance(value, numbers.Real) and not isinstance(value, bool):
        array = np.asarray(value)
    else:
        raise TypeError(f"'{name}' must be a number or a float Tensor, but got {type(value).__name__}.")
    if array.dtype == np.bool_ or array.size != 1:
        raise TypeError(f"'{name}' must be one float value, but got {array.dtype} of shape {array.shape}.")
    return positive_float32(name, array.reshape(-1)[0])


def rule_scale(rule, argument="rule"):
    """``(initial scale, scale shape)`` of a ``rule`` that is not a :class:`LossScaleRule`: an update Cell, a float
    Tensor of shape () or (1,), or a number; ``TypeError``/``ValueError`` naming ``argument`` otherwise.

    Example:
        >>> rule_scale(Tensor(np.float32(8.0)))
        (8.0, ())
    """
    if isinstance(rule, nn.Cell):
        if not hasattr(rule, "get_loss_scale"):
            raise TypeError(
                f"'{argument}' Cell must have a get_loss_scale() method (an update cell), but got "
                f"{type(rule).__name__}."
            )
        return positive_scale(argument, rule.get_loss_scale()), ()
    if isinstance(rule, Tensor):
        if rule.shape not in ((), (1,)):
            raise ValueError(f"'{argument}' Tensor must have shape () or (1,), but got shape {rule.shape}.")
        return positive_scale(argument, rule), rule.shape
    if isinstance(rule, numbers.Real) and not isinstance(rule, bool):
        return positive_scale(argument, rule), ()
    raise TypeError(
        f"'{argument}' must be a loss-scale rule (a LossScalePolicy, or any LossScaleRule), an update Cell, a number "
        f"or a Tensor, but got {type(rule).__name__}."
    )


def warn_if_scaled_outside_differentiation(anchor):
    """Host: warn when a loss is scaled from Python outside a function being differentiated (``anchor``: a Parameter,
    see :func:`lossscale.core._parameters.outside_graph`). That scaled loss carries no gradients: the unscaled loss's
    gradients, divided by the scale, would be applied S times too small. Inside ``mindspore.jit`` nothing tells.

    Example:
        >>> import warnings
        >>> core = LossScaler(8.0, name="doc_outside_differentiation")
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     scaled = core.scale(Tensor(np.float32(1.0)))      # not inside value_and_grad's function
        >>> float(scaled), [w.category.__name__ for w in caught]
        (8.0, ['UserWarning'])
    """
    if not isinstance(anchor, Parameter):
        raise TypeError(
            f"'anchor' must be a Parameter (one that a compiled function reads as a variable), but got "
            f"{type(anchor).__name__}."
        )
    if outside_graph(anchor) and not differentiating():
        warn_at_caller(
            "A loss was scaled from Python outside a function being differentiated: the scaled loss "
            "carries no gradients. Scale the loss inside the function you give to mindspore.value_and_grad "
            "(return scaler.scale(loss), or optimizer.get_scaled_loss(loss), from it): gradients of the "
            "unscaled loss would be divided by the scale and applied that many times too small.",
            UserWarning,
        )
    return True


def _check_loss(loss):
    """A TypeError naming what came where a loss belongs (MindSpore's own error names a primitive or an attribute)."""
    if not isinstance(loss, Tensor):
        raise TypeError(
            f"'outputs' must be a Tensor (a loss) or a nested tuple/list of Tensors, but got "
            f"{type(loss).__name__} {loss!r}: scale the loss tensor itself."
        )


def _scale_tree(scale, tree, before_backward):
    """Each loss of a nested tuple/list (kept a tuple or a list, as PyTorch does) promoted to at least float32 and
    times ``S + stop_gradient(0 or nan)``: S while the loss is finite, nan when it is not, so every gradient computed
    from a non-finite loss is nan and its step skipped; nothing is recorded for later."""
    if isinstance(tree, (tuple, list)):
        scaled = ()
        for item in tree:
            scaled = scaled + (_scale_tree(scale, item, before_backward),)
        return list(scaled) if isinstance(tree, list) else scaled
    _check_loss(tree)
    loss = before_backward(tree)
    factor = scale + ops.stop_gradient(gradients.zero_or_nan(loss))
    dtype = ops.dtype(loss)
    if dtype == mstype.float64:
        return loss * ops.cast(factor, mstype.float64)
    if dtype == mstype.float16 or dtype == mstype.bfloat16:
        loss = ops.cast(loss, mstype.float32)
    return loss * factor


_loss_term = ops.MultitypeFuncGraph("_loss_term")


@_loss_term.register("Tensor")
def _tensor_loss_term(loss):
    """0 when ``loss`` is finite, nan otherwise (float32)."""
    return gradients.zero_or_nan(loss)


@_loss_term.register("Number")
@_loss_term.register("String")
@_loss_term.register("None")
@_loss_term.register("Dictionary")
def _python_loss_term(loss):
    """A Python value where a loss belongs (under jit, where ``_scale_tree``'s check may be analysed later)."""
    return _check_loss(loss)


def _sum_tree(tree):
    """The sum of the scalars of a nested tuple/list (unrolled at compile time)."""
    if isinstance(tree, (tuple, list)):
        result = Tensor(0.0, mstype.float32)
        for item in tree:
            result = result + _sum_tree(item)
        return result
    return tree


@constexpr
def _refuse_adjust_call(positional, missing):
    """TypeError (while tracing) unless :meth:`LossScaler.adjust` got its decision as ``overflow=`` only."""
    if positional or missing:
        got = f"{positional} positional argument(s)" if positional else "no decision"
        raise TypeError(
            f"LossScaler.adjust takes the decision by keyword, adjust(overflow=...), True backing the "
            f"scale off, but got {got}. jmp's and mindspore.amp.DynamicLossScaler's adjust(grads_finite) "
            f"mean the opposite: give their flag as adjust(overflow=ops.logical_not(grads_finite))."
        )
    return True


class LossScaler(nn.Cell):
    """The loss-scaling core: the scale, what decides it and the backend's overflow check.

    Args:
        rule: what decides the scale: a :class:`lossscale.core.rule.LossScaleRule` (``LossScalePolicy``,
            ``AdaptiveWindowRule``, a preset or your own), a number or a float Tensor of shape () or (1,) (a fixed
            scale), or an update Cell (``cell(scale, overflow) -> overflow`` with ``get_loss_scale()``: lossscale's
            or MindSpore's), which decides as in MindSpore's train cell.
        name (str, optional): prefix of the Parameter names (``<name>.scale``, ``<name>.good_steps``, ...); None
            keeps the train cell's (``scale_sense``, ``loss_scale_good_steps``, ...).
        overflow_check (str or check Cell, optional): see :func:`lossscale.core.overflow.make_overflow_check`.
        mutable_rule (bool): hold a rule's settings and a dynamic/fixed switch in Parameters, so that
            :meth:`set_rule` reaches graphs compiled before (front-ends with setters).
        frozen (bool): a fixed scale held as a graph constant, which no checkpoint or host write can change (the
            train cell's when the optimizer divides by the scale itself).

    Host syncs: :meth:`get_scale` (eagerly) and :meth:`state_dict` read the device; :meth:`set_scale`,
    :meth:`load_state_dict` and :meth:`set_rule` write it. The graph methods never sync.

    Example (one step of a custom loop; a front-end adds only its framework's API to this):
        >>> import mindspore as ms
        >>> from lossscale.core.policy import LossScalePolicy
        >>> core = LossScaler(LossScalePolicy(init_scale=2.0**10, growth_interval=2), name="doc_loop")
        >>> class ScaledLoss(nn.Cell):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.net, self.core = nn.Dense(2, 1, weight_init="ones"), core
        ...     def construct(self, x):
        ...         return self.core.scale(self.net(x).sum())
        >>> loss = ScaledLoss()
        >>> net, opt = loss.net, nn.SGD(loss.net.trainable_params(), 0.1)
        >>> _, grads = ms.value_and_grad(loss, None, opt.parameters)(Tensor(np.ones((1, 2), np.float32)))
        >>> grads = core.unscale(grads)
        >>> overflow = core.is_overflow(core.flag(None, grads))
        >>> if not overflow:
        ...     _ = opt(grads)
        >>> _ = core.adjust(overflow=overflow)
        >>> net.weight.asnumpy().tolist(), core.state_dict()["good_steps"]
        ([[0.8999999761581421, 0.8999999761581421]], 1)
    """

    frozen = read_only("frozen", "the scale is a graph constant or a Parameter from the start; build a new LossScaler.")
    is_distributed = read_only(
        "is_distributed",
        "the all-reduce of the overflow flag is part of the compiled step; it follows the parallel mode set when "
        "the LossScaler is built.",
    )

    def __init__(self, rule, *, name=None, overflow_check=None, mutable_rule=False, frozen=False):
        super().__init__(auto_prefix=False)
        if name is not None:
            check_name(name)
        check_bool("mutable_rule", mutable_rule)
        if isinstance(rule, LossScaleRule):
            rule = update_cell_of(rule, mutable_rule)
        initial, shape = rule_scale(rule)
        self.update_cell = rule if isinstance(rule, nn.Cell) else None
        self._frozen = check_bool("frozen", frozen)
        if frozen and holder_of(self.update_cell, False).dynamic:
            raise ValueError(
                "'frozen' needs a fixed scale (a number, a Tensor or a fixed update cell), but the rule is dynamic."
            )
        self._holder = holder_of(self.update_cell, frozen, float(initial))  # asked by every host method below
        self._frozen_scale = float(initial)
        value = Tensor(np.full(shape, initial, np.float32))
        scale_name = "scale_sense" if name is None else f"{name}.scale"
        self.scale_value = value if frozen else Parameter(value, name=scale_name, requires_grad=False)
        if name is not None and hasattr(self.update_cell, "rename_parameters"):
            self.update_cell.rename_parameters(name)
        if hasattr(self.update_cell, "bind_scale_parameter"):
            self.update_cell.bind_scale_parameter(self.scale_value)
        self.check = make_overflow_check(overflow_check)
        self.hyper_map = ops.HyperMap()
        self._is_distributed = is_parallel()
        if self._is_distributed:
            self.allreduce = ops.AllReduce(ops.ReduceOp.SUM, GlobalComm.WORLD_COMM_GROUP)
        self._one, self._zero = Tensor(1.0, mstype.float32), Tensor(0.0, mstype.float32)

    # ---- graph methods ------------------------------------------------------------------------------------------
    def scale(self, outputs, scale=None):
        """Each tensor of ``outputs`` (a Tensor or a nested tuple/list) promoted to >= float32, times S; a loss that
        is not finite is multiplied by nan, so every gradient computed from it is nan and its step is skipped. On
        Ascend saturation mode the float-status register is cleared as the backward pass begins. Called from Python
        outside a function being differentiated, it warns (:func:`warn_if_scaled_outside_differentiation`)."""
        if not self._frozen:
            warn_if_scaled_outside_differentiation(self.scale_value)
        scale = self.scale_value.reshape(()) if scale is None else scale
        return _scale_tree(scale, outputs, self.check.before_backward)

    def sens(self, loss, scale=None):
        """The sens (backward input) of ``loss * S``: S cast to ``loss``'s dtype, in ``loss``'s shape."""
        scale = self.scale_value if scale is None else scale
        return ops.cast(ops.broadcast_to(scale.reshape(()), ops.shape(loss)), ops.dtype(loss))

    def unscale(self, grads, scale=None):
        """``grads * (1/S)`` computed in float32 and cast back (exact for float16 at any S); a float64 gradient is
        multiplied in float64."""
        scale = self.scale_value if scale is None else scale
        inv_scale = self._one / ops.cast(scale.reshape(()), mstype.float32)
        return gradients.multiply_gradients(self.hyper_map, inv_scale, grads)

    def start(self, pre_cond, compute_input):
        """The check's pre-backward step: ``(status, compute_input)`` (see :mod:`lossscale.core.overflow`)."""
        return self.check.start(pre_cond, compute_input)

    def flag(self, status, grads):
        """This rank's float32 overflow flag for ``grads`` (0 when all are finite); ``status`` from :meth:`start`, or
        None (the check makes its own). A non-finite loss: add :meth:`loss_flag`."""
        return self.check.flag(initial_status() if status is None else status, grads)

    def loss_flag(self, loss):
        """0 when every value of ``loss`` (a Tensor or nested tuple/list) is finite, nan otherwise."""
        return _sum_tree(self.hyper_map(_loss_term, loss))

    def statistics(self, grads, scale=None):
        """The gradient statistics the rule reads (:meth:`lossscale.core.rule.LossScaleRule.measure`) of ``grads``:
        unscaled gradients at the current scale (default), or ``scale`` (1 for gradients still scaled); summed over
        the ranks in any parallel mode (one all-reduce), so every rank decides alike. ``()`` for a rule that reads
        none, a fixed number and another update Cell: nothing is computed."""
        rule = self.rule
        if rule is None or not rule.statistics:
            return ()
        scale = self.scale_value if scale is None else scale
        scale = ops.cast(scale, mstype.float32).reshape(())
        values = rule.measure(self.hyper_map, grads, scale, *self.update_cell.settings)
        if self._is_distributed:
            values = tuple(ops.unstack(self.allreduce(ops.stack(values))))
        return values

    def is_overflow(self, flag):
        """``flag != 0`` after summing it over the ranks in any parallel mode (one 4-byte all-reduce); compiled in a
        parallel mode set after this LossScaler was built: ``RuntimeError``."""
        refuse_parallel_mode_set_after_build(self._is_distributed)
        if self._is_distributed:
            flag = self.allreduce(flag)
        return ops.not_equal(flag, self._zero)

    def adjust(self, *positional, overflow=None, statistics=()):
        """Apply the rule for this step's ``overflow`` (True: back off); return ``overflow``. Keyword-only: jmp's and
        ``mindspore.amp.DynamicLossScaler``'s ``adjust(grads_finite)`` mean the opposite, so a positional decision,
        or none, is a ``TypeError`` while tracing (nothing changes)."""
        _refuse_adjust_call(len(positional), overflow is None)
        return apply_rule(self, overflow, statistics)

    def dynamic_flag(self):
        """Graph: whether the scale is dynamic now (a mutable rule's switch is a Parameter, else a constant)."""
        if isinstance(self.update_cell, LossScaleUpdateCell):
            return self.update_cell.dynamic_flag()
        return Tensor(self.dynamic, mstype.bool_)

    # ---- host methods ---------------------------------------------------------------------------------------
    @property
    def rule(self):
        """The rule of lossscale's update cell, or None (a fixed number, or another update Cell)."""
        return self._holder.rule

    @property
    def dynamic(self):
        """Whether the scale changes with overflows."""
        return self._holder.dynamic

    def get_scale(self):
        """The scale: eagerly a Python float (one host sync; a frozen one needs none); inside a compiled function a
        float32 scalar Tensor read when the graph runs."""
        if self._frozen:
            return self._frozen_scale
        return read_scalar(self.scale_value)

    def checked_scale(self, value, argument="scale"):
        """``value`` (a number or a one-value Tensor) as a float32 NumPy scalar if it can be the scale: finite, > 0,
        with a finite reciprocal and within the rule's bounds; else an error naming ``argument``.

        Example:
            >>> from lossscale.core.policy import LossScalePolicy
            >>> LossScaler(LossScalePolicy(init_scale=8.0, max_scale=16.0)).checked_scale(32.0)
            Traceback (most recent call last):
            ...
            ValueError: 'scale' must be within the update cell's [min_loss_scale, max_loss_scale] = [1.0, 16.0], ...
        """
        scale = positive_scale(argument, value)
        low, high = self._holder.bounds()
        if not low <= scale <= high:
            raise ValueError(
                f"'{argument}' must be within the update cell's [min_loss_scale, max_loss_scale] = [{low!r}, "
                f"{high!r}], but got {float(scale)!r}."
            )
        return scale

    def set_scale(self, value):
        """Write a new scale (checked: :meth:`checked_scale`), host to device, no graph rebuild."""
        if self._frozen:
            raise ValueError("this loss scale is frozen (a graph constant): it cannot be changed.")
        write_parameter(self.scale_value, self.checked_scale(value))

    def set_rule(self, rule=None, state=None, dynamic=None):
        """Change a mutable rule (``mutable_rule=True``): the rule (of the same structure), the state and/or fixed vs
        dynamic; checked first."""
        self._holder.set_rule(rule, state, dynamic)

    def state_dict(self):
        """The scale and the rule's counters under their keys (``loss_scale``, ...), as Python numbers (one sync)."""
        return self._holder.state_dict(self)

    def load_state_dict(self, state):
        """Restore :meth:`state_dict` output (checked; nothing changes on error). A fixed or frozen scale cannot
        change: its state must hold that scale."""
        self._holder.load_state_dict(self, state)

    def check_update_cell_owner(self):
        """RuntimeError if another core (another train cell) has adopted this core's update cell since: one update
        cell holds one scale's counters, so two train cells sharing it would change each other's scales."""
        self._holder.check_owner(self)


def scale_tensor(core):
    """``core.get_scale()`` as a float32 scalar Tensor: eagerly a copy (one host sync), inside a compiled function the
    graph read itself (Paddle's ``get_loss_scaling``, tf.keras' ``loss_scale``)."""
    scale = core.get_scale()
    return scale if isinstance(scale, Tensor) else Tensor(scale, mstype.float32)


def apply_rule(core, overflow, statistics=()):
    """Graph: :meth:`LossScaler.adjust` for the train cell and the front-ends, which call it positionally (a keyword
    call inside their graphs made MindSpore 2.10 fold a GradScaler's unscaling of constant gradients into ``(0, 0)``,
    measured); ``overflow`` a bool Tensor (or a Python or NumPy bool); ``statistics`` for a rule that reads some."""
    if isinstance(overflow, (bool, np.bool_)):
        overflow = Tensor(bool(overflow), mstype.bool_)
    else:
        check_overflow_argument(overflow)
    cell = core.update_cell
    if cell is None:
        return overflow
    if isinstance(cell, LossScaleUpdateCell):
        return cell(core.scale_value, overflow, statistics)
    return cell(core.scale_value, overflow)
