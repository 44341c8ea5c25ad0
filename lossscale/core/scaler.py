"""``LossScaler``: loss scaling itself, once, for the train cell and every front-end.

A small protocol in the spirit of jmp's ``LossScale`` and ``mindspore.amp.DynamicLossScaler``.
The core owns the scale (a float32 Parameter), the update rule (an update cell) and the
backend's overflow check (:mod:`lossscale.core.overflow`). Everything below is graph code
(usable eagerly, inside ``construct`` and inside ``mindspore.jit``) unless marked host::

    scaled = core.scale(outputs)          # each loss promoted to >= float32, times S (nan if not finite)
    sens = core.sens(loss)                # S in the loss dtype: the sens (backward input) of loss * S
    grads = core.unscale(grads)           # g * (1/S) in float32 (float64 for float64 g), in g's dtype
    status, x = core.start(pre_cond, x)   # the check's pre-backward step (Ascend: clear the register)
    flag = core.flag(status, grads)       # float32, 0 when this rank's gradients are finite
    flag = flag + core.loss_flag(loss)    # a non-finite loss is an overflow too (0 or nan)
    overflow = core.is_overflow(flag)     # all-reduced first in any parallel mode: ranks agree
    core.adjust(overflow=overflow)        # the update rule: back off / grow (no-op for a fixed scale)
    core.state_dict(), core.load_state_dict(state), core.set_scale(v)                     # host
    core.get_scale()                      # host (a float); inside a compiled function a graph read (a Tensor)
    core.get_scale_tensor()               # the same as a float32 Tensor in both cases

Why promote in :meth:`scale` and not in :meth:`sens`: the gradient of
``float32(loss) * S`` reaching a float16 loss is ``float16(S)``, exactly the sens
:meth:`sens` gives the train cell's backward, so every user of the core computes the
same gradients; only the returned scaled value differs (it cannot overflow float16).

Parameter names: by default the train cell's (``scale_sense`` plus the update cell's
``loss_scale_good_steps``/``loss_scale_hysteresis_left``, unchanged since 0.1.0); with
``name="x"`` they are ``x.scale``, ``x.good_steps``, ... so any number of cores can share
one graph.

Example:
    >>> import numpy as np
    >>> from mindspore import Tensor
    >>> from lossscale.core.policy import LossScalePolicy
    >>> core = LossScaler(LossScalePolicy(init_scale=8.0, growth_interval=2), name="demo")
    >>> float(core.scale(Tensor(np.float32(0.5)))), [p.name for p in core.get_parameters()]
    (4.0, ['demo.scale', 'demo.good_steps', 'demo.hysteresis_left'])
    >>> grads = core.unscale((Tensor(np.array([8.0, 16.0], np.float32)),))
    >>> grads[0].asnumpy().tolist(), bool(core.is_overflow(core.flag(None, grads)))
    ([1.0, 2.0], False)
"""

import numbers

import numpy as np
from mindspore import Parameter, Tensor, get_context, nn, ops
from mindspore.common import dtype as mstype
from mindspore.communication.management import GlobalComm
from mindspore.ops import constexpr
from mindspore.ops import functional as F

from lossscale.core import overflow as _overflow
from lossscale.core._naming import check_name
from lossscale.core._parameters import outside_graph
from lossscale.core._validation import check_bool, read_only
from lossscale.core._warnings import warn_at_caller
from lossscale.core.adaptive import AdaptiveWindowRule
from lossscale.core.adaptive_cell import AdaptiveLossScaleUpdateCell
from lossscale.core.compat import differentiating
from lossscale.core.parallel import is_parallel, refuse_parallel_mode_set_after_build
from lossscale.core.policy import LossScalePolicy
from lossscale.core.rule_kinds import rule_kind
from lossscale.core.scaler_state import ScalerHostState, positive_scale
from lossscale.core.update_cells import (
    DynamicLossScaleUpdateCell,
    check_overflow_argument,
)


def _promote(scale, output):
    """``output * scale`` with ``output`` promoted to at least float32."""
    dtype = ops.dtype(output)
    if dtype == mstype.float16 or dtype == mstype.bfloat16:
        output = ops.cast(output, mstype.float32)
    elif dtype == mstype.float64:
        return output * ops.cast(scale, mstype.float64)
    return output * scale


def _scale_tree(scale, tree, before_backward):
    """:func:`_promote` on every tensor of a nested tuple/list, keeping tuples and lists (as PyTorch does);
    each loss first goes through the check's ``before_backward`` (identity but on Ascend saturation mode).

    Each loss is multiplied by ``S + stop_gradient(0 or nan)``: exactly S while the loss is finite, nan
    when it is not, so every gradient computed from a non-finite loss is nan and the step it feeds is
    skipped by the usual check. The decision travels with those gradients and nothing is recorded: a
    batch the caller drops by hand leaves no trace in the next iteration."""
    if isinstance(tree, (tuple, list)):
        scaled = ()
        for item in tree:
            scaled = scaled + (_scale_tree(scale, item, before_backward),)
        return list(scaled) if isinstance(tree, list) else scaled
    _check_loss(tree)
    loss = before_backward(tree)
    return _promote(scale + ops.stop_gradient(_overflow.zero_or_nan(loss)), loss)


def warn_if_scaled_outside_differentiation(anchor):
    """Host: warn when a loss is scaled from Python outside a function being differentiated; nothing inside a
    compiled function (``anchor``: a Parameter, see :func:`lossscale.core._parameters.outside_graph`).

    Such a scaled loss carries no gradients: gradients computed from the unscaled loss, then divided by
    the scale, would be applied S times too small without any error (PyTorch's ``scaler.scale(loss)``
    is followed by ``.backward()``; MindSpore differentiates a function, so the loss must be scaled
    inside it). Inside ``mindspore.jit`` nothing can tell the two places apart.

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
    """A TypeError naming what came where a loss tensor belongs: a Python or NumPy value (MindSpore's own error
    would name a primitive, ``Dtype``, eagerly and an attribute under jit)."""
    if not isinstance(loss, Tensor):
        raise TypeError(
            f"'outputs' must be a Tensor (a loss) or a nested tuple/list of Tensors, but got "
            f"{type(loss).__name__} {loss!r}: scale the loss tensor itself."
        )


def _overflow_tensor(overflow):
    """``overflow`` for :meth:`LossScaler.adjust` as a bool Tensor: a Python or NumPy bool is converted; anything else
    but a one-value bool Tensor is a TypeError while tracing (:func:`check_overflow_argument`; MindSpore's own
    error names a ``Select`` kernel)."""
    if isinstance(overflow, (bool, np.bool_)):
        return Tensor(bool(overflow), mstype.bool_)
    check_overflow_argument(overflow)
    return overflow


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


_loss_term = ops.MultitypeFuncGraph("_loss_term")


@_loss_term.register("Tensor")
def _tensor_loss_term(loss):
    """0 when ``loss`` is finite, nan otherwise (float32; bfloat16/float64 losses included)."""
    return _overflow.zero_or_nan(loss)


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
        total = Tensor(0.0, mstype.float32)
        for item in tree:
            total = total + _sum_tree(item)
        return total
    return tree


def rule_scale(rule, argument="rule"):
    """``(initial scale, scale shape)`` of a ``rule`` that is not a LossScalePolicy: an update Cell, a float
    Tensor of shape () or (1,), or a number. ``TypeError``/``ValueError`` naming ``argument`` otherwise (the
    train cell checks its ``scale_sense`` with it).

    Example:
        >>> rule_scale(Tensor(np.float32(8.0)))
        (8.0, ())
    """
    if isinstance(rule, nn.Cell):
        if not hasattr(rule, "get_loss_scale"):
            raise TypeError(
                f"'{argument}' Cell must have a get_loss_scale() method (an update cell), "
                f"but got {type(rule).__name__}."
            )
        return positive_scale(argument, rule.get_loss_scale()), ()
    if isinstance(rule, Tensor):
        if rule.shape not in ((), (1,)):
            raise ValueError(f"'{argument}' Tensor must have shape () or (1,), but got shape {rule.shape}.")
        return positive_scale(argument, rule), rule.shape
    if isinstance(rule, numbers.Real) and not isinstance(rule, bool):
        return positive_scale(argument, rule), ()
    raise TypeError(
        f"'{argument}' must be an update Cell, a LossScalePolicy, a number or a Tensor, but got {type(rule).__name__}."
    )


class LossScaler(ScalerHostState, nn.Cell):
    """The loss-scaling core: the scale, its update rule and the backend's overflow check.

    Args:
        rule: what decides the scale.

            - a :class:`lossscale.core.policy.LossScalePolicy`: dynamic scaling with that rule;
            - a :class:`lossscale.core.adaptive.AdaptiveWindowRule`: MindFormers' adaptive window;
            - a number or a float Tensor of shape () or (1,): a fixed scale;
            - an update Cell (``cell(scale, overflow) -> overflow`` with ``get_loss_scale()``:
              ours or MindSpore's): that cell decides, as in MindSpore's train cell.

        name (str, optional): prefix of the Parameter names (see the module docstring);
            None keeps the train cell's names.
        overflow_check (str or check Cell, optional): see :func:`lossscale.core.overflow.make_overflow_check`;
            default the current backend's.
        mutable_rule (bool): hold a dynamic rule's numbers and a dynamic/fixed switch in
            Parameters, so :meth:`set_rule` reaches graphs compiled before (front-ends with setters).
        frozen (bool): a fixed scale held as a graph constant instead of a Parameter, so that no
            checkpoint load or host write can change it (the train cell uses it when the optimizer
            divides by the scale itself: MindSpore's ``FixedLossScaleManager(S, False)`` recipe).

    The scale Parameter has the shape of a Tensor ``rule`` (``()`` or ``(1,)``), else ``()``.

    Host syncs: :meth:`get_scale` (called eagerly) and :meth:`state_dict` read the device; :meth:`set_scale`,
    :meth:`load_state_dict` and :meth:`set_rule` write it. The graph methods never sync.

    Example (one step of a custom loop; a front-end adds only its framework's API to this):
        >>> import mindspore as ms
        >>> from mindspore import nn
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
        "the all-reduce of the overflow flag is part of the compiled "
        "step; it follows the parallel mode set when the LossScaler is built.",
    )

    def __init__(self, rule, *, name=None, overflow_check=None, mutable_rule=False, frozen=False):
        super().__init__(auto_prefix=False)
        if name is not None:
            check_name(name)
        check_bool("mutable_rule", mutable_rule)
        self.hyper_map = ops.HyperMap()
        self.check = _overflow.make_overflow_check(overflow_check)
        self.update_cell, initial, shape = self._adopt_rule(rule, mutable_rule)
        self._frozen = check_bool("frozen", frozen)
        if frozen and rule_kind(self.update_cell, False).dynamic:
            raise ValueError(
                "'frozen' needs a fixed scale (a number, a Tensor or a fixed update cell), but the rule is dynamic."
            )
        # What decides the scale, chosen once: the host methods below ask it (lossscale.core.rule_kinds).
        self._kind = rule_kind(self.update_cell, frozen, float(initial))
        scale_name = "scale_sense" if name is None else f"{name}.scale"
        value = Tensor(np.full(shape, initial, np.float32))
        # A frozen scale is a constant of the graph: no checkpoint or host write can change it.
        self.scale_value = value if frozen else Parameter(value, name=scale_name, requires_grad=False)
        self._frozen_scale = float(initial)
        if name is not None and hasattr(self.update_cell, "rename_parameters"):
            self.update_cell.rename_parameters(name)
        if self.update_cell is not None and hasattr(self.update_cell, "bind_scale_parameter"):
            self.update_cell.bind_scale_parameter(self.scale_value)
        self._is_distributed = is_parallel()
        if self._is_distributed:
            self.allreduce = ops.AllReduce(ops.ReduceOp.SUM, GlobalComm.WORLD_COMM_GROUP)
        self._one = Tensor(1.0, mstype.float32)
        self._zero = Tensor(0.0, mstype.float32)

    @staticmethod
    def _adopt_rule(rule, mutable_rule):
        """``(update cell or None, initial scale, scale shape)`` for the accepted kinds of ``rule``."""
        if isinstance(rule, LossScalePolicy):
            cell = DynamicLossScaleUpdateCell.from_policy(rule, mutable_rule=mutable_rule)
            return cell, cell.get_loss_scale(), ()
        if isinstance(rule, AdaptiveWindowRule):
            cell = AdaptiveLossScaleUpdateCell.from_rule(rule)
            return cell, cell.get_loss_scale(), ()
        initial, shape = rule_scale(rule)
        return (rule if isinstance(rule, nn.Cell) else None), initial, shape

    # ---- graph methods ------------------------------------------------------------------------
    def scale(self, outputs, scale=None):
        """Each tensor of ``outputs`` (a Tensor or a nested tuple/list) promoted to >= float32, times S.

        A loss that is not finite is multiplied by nan instead: every gradient computed from it is nan,
        so the step those gradients feed counts as an overflow (its scaled value reads nan).

        On Ascend saturation mode the float-status register is cleared when the backward pass of
        the scaled loss begins (after the forward pass), so what gets checked is that backward pass.

        Called from Python outside a function being differentiated, it warns: that scaled loss
        carries no gradients (:func:`warn_if_scaled_outside_differentiation`; a frozen scale is a
        constant, which cannot tell Python from a compiled function: its owner warns instead).
        """
        if not self._frozen:
            warn_if_scaled_outside_differentiation(self.scale_value)
        scale = self.scale_value.reshape(()) if scale is None else scale
        return _scale_tree(scale, outputs, self.check.before_backward)

    def sens(self, loss, scale=None):
        """The sens (backward input) of ``loss * S``: S cast to ``loss``'s dtype, in ``loss``'s shape."""
        scale = self.scale_value if scale is None else scale
        return ops.cast(ops.broadcast_to(scale.reshape(()), ops.shape(loss)), ops.dtype(loss))

    def unscale(self, grads, scale=None):
        """``grads * (1/S)`` computed in float32 and cast back (exact for float16 at any S); a float64 gradient
        is multiplied in float64, keeping its precision and range."""
        scale = self.scale_value if scale is None else scale
        inv_scale = self._one / ops.cast(scale.reshape(()), mstype.float32)
        return _overflow.unscale_gradients(self.hyper_map, inv_scale, grads)

    def start(self, pre_cond, compute_input):
        """The check's pre-backward step: ``(status, compute_input)`` (see :mod:`lossscale.core.overflow`)."""
        return self.check.start(pre_cond, compute_input)

    def flag(self, status, grads):
        """This rank's float32 overflow flag for ``grads``: 0 when all are finite. ``status``: the one
        :meth:`start` returned, or None where the caller has none (the check then makes its own)."""
        if status is None:
            status = _overflow.initial_status()
        return self.check.flag(status, grads)

    def loss_flag(self, loss):
        """0 when every value of ``loss`` (a Tensor or nested tuple/list) is finite, nan otherwise."""
        return _sum_tree(self.hyper_map(_loss_term, loss))

    def is_overflow(self, flag):
        """``flag != 0`` after summing it over all ranks in any parallel mode (one 4-byte all-reduce). Compiling it
        in a parallel mode set after this LossScaler was built is a ``RuntimeError``."""
        refuse_parallel_mode_set_after_build(self._is_distributed)
        if self._is_distributed:
            flag = self.allreduce(flag)
        return ops.not_equal(flag, self._zero)

    def refuse_non_finite_scale(self):
        """Graph: raise ``ValueError`` if the scale is not finite; returns the scale. For the branch that skips a
        step, after the update rule ran (a dynamic rule brings an inf scale back within its bounds): a non-finite
        fixed scale written into a running cell (``load_param_into_net``, ``Parameter.set_data``) would skip every
        step from then on. The train cell compiles a new graph at its next call (a graph that raised fails at every
        later call), so once a finite scale is set it trains on."""
        scale = self.scale_value.reshape(())
        if not ops.isfinite(scale):
            raise ValueError(
                "the loss scale is not finite (it was written into the running cell, by "
                "load_param_into_net or set_data?): every step would be skipped. Write a finite scale back "
                "with load_state_dict({'loss_scale': S}) (a fixed update cell: its own S) or set_sense_scale(), "
                "and the cell trains on."
            )
        return scale

    def adjust(self, *positional, overflow=None):
        """Apply the update rule to the scale for this step's ``overflow`` (True: back off); return ``overflow``.

        ``overflow`` is keyword-only: jmp's and ``mindspore.amp.DynamicLossScaler``'s ``adjust(grads_finite)``
        take the opposite polarity, and their habit ``adjust(all_finite(grads))`` would back off on every clean
        step. A positional decision, or none, is a ``TypeError`` while tracing (nothing changes). The migration
        of ``DynamicLossScaler`` is ``GradScaler.update()`` (docs/migration.md)."""
        _refuse_adjust_call(len(positional), overflow is None)
        return self.apply_rule(overflow)

    def apply_rule(self, overflow):
        """:meth:`adjust` for the train cell and the front-ends, which call it positionally: a keyword call inside
        their graphs made MindSpore 2.10 fold a GradScaler's unscaling of constant gradients into ``(0, 0)``
        (measured: "Cannot join the return values of different branches")."""
        overflow = _overflow_tensor(overflow)
        if self.update_cell is None:
            return overflow
        return self.update_cell(self.scale_value, overflow)

    def dynamic_flag(self):
        """Graph: whether the scale is currently dynamic (a Parameter with a mutable rule, else a constant)."""
        if getattr(self.update_cell, "mutable_rule", False):
            return self.update_cell.dynamic_flag()
        return Tensor(self.dynamic, mstype.bool_)

    def assign_scale(self, value):
        """Graph-mode write of a new scale (``GradScaler.update(new_scale)``); returns the assign."""
        return ops.assign(self.scale_value, ops.cast(value, mstype.float32).reshape(self.scale_value.shape))


# check=False: only the kind of ``grads`` matters here, never the values of its tensors, which inside a graph are not
# constants; MindSpore would otherwise log "is a constexpr function. The input arguments must be all constant value"
# at every compilation of the user's step.
@constexpr(check=False)
def refuse_non_gradients(grads, argument, allow_empty=False):
    """TypeError, at trace time inside a graph, unless ``grads`` (given to a front-end where the gradients go) is
    a tuple or list of gradients: :func:`refuse_non_sequence`, then :func:`refuse_non_tensor_entries`.

    Example:
        >>> refuse_non_gradients((Tensor(np.float32(1.0)),), "grads")
        True
    """
    refuse_non_sequence(grads, argument, allow_empty)
    return refuse_non_tensor_entries(grads, argument)


def refuse_non_sequence(grads, argument, allow_empty=False):
    """TypeError, at trace time inside a graph, unless ``grads`` is a tuple or list. One Tensor is Paddle's habit
    ``minimize(optimizer, scaled_loss)``; an optimizer is PyTorch's ``unscale_(optimizer)``/``step(optimizer,
    ...)``: both frameworks find the gradients on the optimizer, while MindSpore's are values. An empty one is a
    ValueError unless ``allow_empty`` (there is nothing to check, and the optimizer needs a gradient per
    parameter).

    Example:
        >>> refuse_non_sequence([], "grads", allow_empty=True)
        True
    """
    if isinstance(grads, Tensor):
        raise TypeError(
            f"'{argument}' must be a tuple or list of gradients, one per parameter of the optimizer (what "
            f"mindspore.value_and_grad returns for them), but got a single Tensor. MindSpore gradients "
            f"are values: differentiate the scaled loss and pass its gradients."
        )
    if isinstance(grads, nn.Cell):
        raise TypeError(
            f"'{argument}' must be a tuple or list of gradients, one per parameter of the optimizer, but "
            f"got a Cell (an optimizer?). PyTorch's unscale_(optimizer) and step(optimizer) find the "
            f"gradients on the optimizer; MindSpore gradients are values: differentiate the scaled loss "
            f"with mindspore.value_and_grad and pass them, e.g. grads = scaler.unscale_(grads), then "
            f"scaler.step(optimizer, grads)."
        )
    if not isinstance(grads, (tuple, list)):
        raise TypeError(
            f"'{argument}' must be a tuple or list of gradients, one per parameter of the optimizer (what "
            f"mindspore.value_and_grad returns for them)."
        )
    if not grads and not allow_empty:
        raise ValueError(
            f"'{argument}' holds no gradients: give one per parameter of the optimizer (what "
            f"mindspore.value_and_grad returns for optimizer.parameters)."
        )
    return True


def _is_eager_row_tensor(grad):
    """Whether ``grad`` is a sparse gradient as ``mindspore.value_and_grad`` returns it outside a graph: the tuple
    ``(indices, values, dense_shape)`` of a RowTensor."""
    if not isinstance(grad, tuple) or len(grad) != 3:
        return False
    indices, values, dense_shape = grad
    return isinstance(indices, Tensor) and isinstance(values, Tensor) and isinstance(dense_shape, tuple)


def refuse_non_tensor_entries(grads, argument):
    """TypeError, at trace time inside a graph, for an entry of ``grads`` that cannot be a gradient: a number or a
    NumPy value (MindSpore's own error says only "For 'MultitypeFuncGraph', the input can not be
    numpy.ndarray"), or a tuple/list: gradients nested one level too deep, as ``mindspore.value_and_grad`` with
    ``grad_position`` and ``weights`` returns them (MindSpore's error names a ``NotEqual`` call), or a sparse
    gradient as MindSpore returns it outside a graph (the tuple of a RowTensor). Tensors and ``None`` are left to
    the caller.

    Example:
        >>> refuse_non_tensor_entries((Tensor(np.float32(1.0)), None), "grads")
        True
    """
    for index, grad in enumerate(grads):
        if isinstance(grad, (bool, int, float, np.ndarray, np.generic)):
            raise TypeError(
                f"'{argument}[{index}]' must be a gradient Tensor, but got {type(grad).__name__}: "
                f"gradients are MindSpore Tensors (convert NumPy values with mindspore.Tensor)."
            )
        if _is_eager_row_tensor(grad):
            raise TypeError(
                f"'{argument}[{index}]' is a sparse gradient (RowTensor: indices, values, dense shape), "
                f"as nn.EmbeddingLookup(sparse=True) gives: the GradScaler and the LossScaleOptimizer "
                f"take dense gradients only. Use nn.Embedding, whose gradients are dense."
            )
        if isinstance(grad, (tuple, list)):
            raise TypeError(
                f"'{argument}[{index}]' must be a gradient Tensor, but got a {type(grad).__name__}: give "
                f"the weights' gradients as one flat tuple (mindspore.value_and_grad with grad_position "
                f"and weights returns (inputs' gradients, weights' gradients): pass the second)."
            )
    return True


_sparse_entry = ops.MultitypeFuncGraph("_sparse_entry")


@constexpr
def _refuse_sparse_entry(argument, index):
    raise TypeError(
        f"'{argument}[{index}]' is a sparse gradient (RowTensor), as nn.EmbeddingLookup(sparse=True) gives: the "
        f"GradScaler and the LossScaleOptimizer take dense gradients only. Use nn.Embedding, whose gradients are dense."
    )


@_sparse_entry.register("String", "Number", "RowTensor")
def _row_tensor_entry(argument, index, grad):
    return _refuse_sparse_entry(argument, index)


@_sparse_entry.register("String", "Number", "Tensor")
@_sparse_entry.register("String", "Number", "None")
def _dense_entry(argument, index, grad):
    return True


@constexpr
def _refuse_undetermined(types, argument):
    """TypeError if the gradients' tuple type (``F.typeof``) is still undetermined while compiling: MindSpore
    leaves the gradients of ``value_and_grad`` so when one of them is sparse, and no entry can be named yet."""
    if "Undetermined" in str(types):
        raise TypeError(
            f"'{argument}' holds a sparse gradient (RowTensor), as nn.EmbeddingLookup(sparse=True) gives (MindSpore "
            f"leaves their types undetermined while compiling, {types}): the GradScaler and the LossScaleOptimizer "
            f"take dense gradients only. Use nn.Embedding, whose gradients are dense."
        )
    return True


def refuse_undetermined_gradients(grads, argument):
    """Graph: the part of :func:`refuse_sparse_gradients` that looks at the tuple's type only (no entry is touched)."""
    return _refuse_undetermined(F.typeof(grads), argument)


def refuse_sparse_gradients(grads, argument):
    """TypeError while a compiled function is traced for a sparse gradient (a RowTensor) among ``grads``, naming the
    entry once its type is known; from Python MindSpore gives them as tuples, which :func:`refuse_non_tensor_entries`
    names. (MindSpore's own errors for them name an ``AddN`` call or a Parameter's dtype conversion.)

    Example:
        >>> refuse_sparse_gradients((Tensor(np.float32(1.0)), None), "grads")
        True
    """
    refuse_undetermined_gradients(grads, argument)
    for index in range(len(grads)):
        _sparse_entry(argument, index, grads[index])
    return True


@constexpr
def refuse_bfloat16_on_cpu(dtypes, argument="optimizer"):
    """TypeError if the Parameters an optimizer updates (their ``dtypes``) include bfloat16 and the device target is
    CPU: MindSpore has no bfloat16 ``Assign`` kernel there, so such a step fails inside MindSpore, after the loss
    scaling has run. A constant check: eagerly, or while a compiled function is traced.

    Example:
        >>> refuse_bfloat16_on_cpu((mstype.float32, mstype.float16))
        True
    """
    if mstype.bfloat16 in dtypes and get_context("device_target") == "CPU":
        raise TypeError(
            f"'{argument}' updates bfloat16 Parameters ({dtypes.count(mstype.bfloat16)} of "
            f"{len(dtypes)}), which cannot be trained on device_target 'CPU': MindSpore has no bfloat16 "
            f"Assign kernel there. Keep the Parameters in float32 (amp levels O2/O3 compute in float16 "
            f"with float32 weights) or float16, or train on Ascend."
        )
    return True


def check_optimizer_loss_scale(optimizer, fixed_scale=None):
    """Return True if ``optimizer`` divides by the loss scale itself and that is allowed; refuse otherwise.

    An optimizer built with ``loss_scale=S`` divides its gradients by S. That is right only
    for a fixed scale equal to S with nothing else unscaling (MindSpore's
    ``FixedLossScaleManager(S, drop_overflow_update=False)`` recipe, ``fixed_scale=S``);
    anywhere else the gradients would be divided twice or by the wrong factor.

    Example:
        >>> from mindspore import nn
        >>> check_optimizer_loss_scale(nn.SGD(nn.Dense(2, 1).trainable_params(), 0.1))
        False
    """
    optimizer_scale = float(getattr(optimizer, "loss_scale", 1.0))
    if optimizer_scale == 1.0:
        return False
    # Compared as the device holds both: the same Python float given to the manager and the optimizer is accepted.
    if fixed_scale is not None and np.float32(optimizer_scale) == np.float32(fixed_scale):
        return True
    expected = "dynamic" if fixed_scale is None else repr(float(np.float32(fixed_scale)))
    raise ValueError(
        f"'optimizer.loss_scale' is {optimizer_scale!r} but the loss scale is {expected}: the gradients would be "
        f"unscaled twice or by the wrong factor. Build the optimizer without 'loss_scale' (lossscale unscales), "
        f"or, with a fixed scale that is applied every step, give it exactly that scale."
    )
