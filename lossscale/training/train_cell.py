"""``TrainOneStepWithLossScaleCell``: one compiled graph that scales, checks, unscales and steps (design.md, 5).

Per call (one training step, no host sync inside the graph)::

    loss  = network(*inputs)
    grads = d(loss * S)/d(weights) * (1 / S)            # unscaled in float32 (float64 for float64)
    flag  = the backend's check of grads + non-finite loss   # all-reduced under data parallel
    update cell(scale, overflow != 0); counters(overflow)
    if not overflow: optimizer(clip(grads))             # skip: weights, moments, global step untouched

Loss scaling itself is the :class:`lossscale.core.scaler.LossScaler` core this cell holds as ``loss_scaler``;
accumulation, clipping, the counters, forensics, the persistent-overflow policy and the BatchNorm statistics
written back on a skipped step are parts of their own.
"""

import inspect

from mindspore import Tensor, get_context, nn, ops
from mindspore.common import dtype as mstype

from lossscale.core import gradients
from lossscale.core._optimizers import check_optimizer_loss_scale, refuse_bfloat16_on_cpu
from lossscale.core._parameters import write_parameter
from lossscale.core._validation import check_bool, check_int_in_range
from lossscale.core.clipping import GlobalNormClip, global_norm
from lossscale.core.compat import compile_again_at_next_call
from lossscale.core.overflow import ASCEND_SATURATION
from lossscale.core.scaler import LossScaler, apply_rule
from lossscale.training.accumulation import GradientAccumulation
from lossscale.training.arguments import (
    check_loss_output,
    check_train_arguments,
    fixed_scale_of,
    refuse_applied_overflows_with_a_dynamic_rule,
    refuse_nn_optimizer_options,
)
from lossscale.training.bookkeeping import (
    OverflowCounters,
    OverflowForensics,
    PersistentOverflowPolicy,
    check_debug_flag,
)
from lossscale.training.checkpoints import CheckpointReceiver, check_cell_state, checkpoint_choice, take_received_state
from lossscale.training.host_state import after_step, checked_sense_scale
from lossscale.training.running_statistics import RunningStatistics
from lossscale.training.subclass_checks import (
    built_option,
    construct_only_options,
    host_call,
    host_call_token,
    host_features,
    keep_update_cell,
    mark_own_construct_traced,
    refuse_options_without_construct,
    refuse_reassigned_options,
    refuse_without_host_call,
)


def _add_mindspore_helpers(cell):
    """The constants the step uses, and the primitives and flags MindSpore's own cell defines, which subclasses
    copied from model zoos use in their ``construct`` or ``get_overflow_status`` (``self.less_equal(self.base,
    self.reduce_sum(status, (0,)))``, with ``self.allreduce`` when ``self.is_distributed``); our own methods use
    only ``hyper_map`` and the constants."""
    cell.hyper_map = ops.HyperMap()
    cell._zero, cell._one = Tensor(0.0, mstype.float32), Tensor(1.0, mstype.float32)
    cell._false = Tensor(False, mstype.bool_)
    cell.base = Tensor(1, mstype.float32)
    cell.base0 = Tensor(0, mstype.int32)
    cell.reduce_sum = ops.ReduceSum(keep_dims=False)
    cell.reduce_all = ops.ReduceAll(keep_dims=False)
    cell.less_equal = ops.LessEqual()
    cell.equal = ops.Equal()
    cell.logic_not = ops.LogicalNot()
    cell.allreduce = ops.AllReduce()
    cell.is_distributed = cell.loss_scaler.is_distributed
    cell.gpu_target = get_context("device_target") == "GPU"


def _output_options(optimizer, extra_outputs, lr_per_micro_batch):
    """``(extra_outputs, lr_per_micro_batch)`` checked, and refused for an optimizer that cannot honour them."""
    options = {"extra_outputs": check_bool("extra_outputs", extra_outputs)}
    options["lr_per_micro_batch"] = check_bool("lr_per_micro_batch", lr_per_micro_batch)
    refuse_nn_optimizer_options(optimizer, options)
    return options["extra_outputs"], options["lr_per_micro_batch"]


class TrainOneStepWithLossScaleCell(nn.TrainOneStepCell):
    r"""Training step with loss scaling that runs on CPU, GPU and Ascend.

    A drop-in for ``mindspore.nn.TrainOneStepWithLossScaleCell`` (same arguments,
    outputs and overridable methods ``start_overflow_check``,
    ``get_overflow_status``, ``process_loss_scale``) that also runs on CPU, unscales
    in float32 (MindSpore casts ``1/scale`` to the gradient dtype, which is 0 in
    float16 once the scale reaches 2**25), counts a non-finite loss as an overflow,
    refuses an optimizer whose own ``loss_scale`` would unscale a second time, and
    adds clipping, accumulation, overflow counters, a persistent-overflow policy
    and overflow forensics.

    Args:
        network (Cell): network with loss; single output.
        optimizer (Cell): the optimizer: an ``nn.Optimizer``, or one of the
            PyTorch-style optimizers of ``mindspore.experimental.optim`` /
            ``mint.optim`` (as MindSpore's cells accept; not with ``extra_outputs``
            or ``lr_per_micro_batch``, which need ``get_lr()`` and ``global_step``).
            Its ``loss_scale`` must be 1 (default), except with a fixed scale equal
            to it (MindSpore's ``FixedLossScaleManager(S, False)`` convention), in
            which case the optimizer unscales and this cell does not.
        scale_sense (Union[Cell, Tensor]): an update cell (e.g.
            :class:`lossscale.DynamicLossScaleUpdateCell`, or MindSpore's) or a
            float32 Tensor of shape () or (1,) changed with :meth:`set_sense_scale`.

    Keyword Args:
        drop_overflow_update (bool): skip the optimizer on overflow (default). False
            applies every step (``FixedLossScaleManager(S, False)``).
        overflow_check (str or check Cell): one of :data:`lossscale.core.overflow.OVERFLOW_CHECKS`
            or a check object. Default: the device target's
            (:func:`lossscale.core.overflow.current_overflow_check`).
        clip_global_norm (float, optional): clip the unscaled gradients to this
            global L2 norm (finite, > 0). The norm also decides the overflow: a
            non-finite norm is an overflow (no second pass over the gradients;
            Ascend saturation mode still reads its status register).
        accumulation_steps (int): micro-batches per optimizer step (>= 1, default 1).
            The optimizer receives the mean of the micro-batch gradients, which
            equals the gradient of one large batch when every micro-loss is a mean
            over equally sized micro-batches. If any micro-batch overflows, the
            whole window is skipped (one backoff), its accumulators are discarded.
        overflow_policy (str): what to do when overflows persist: ``"skip"``
            (default; MindSpore's behaviour, no host work), ``"warn"`` (one
            ``RuntimeWarning``) or ``"raise"`` (:class:`PersistentOverflowError`).
            Triggered after ``max_consecutive_overflows`` consecutive overflowing
            steps, or by an overflow while a dynamic scale is already at its minimum.
            Checked on the host after each call (one sync per step); with ``"warn"``
            or ``"raise"`` (or ``debug_overflow``) the cell refuses to be compiled into
            another graph (your own ``mindspore.jit``), where that check could not run.
        max_consecutive_overflows (int, optional): see ``overflow_policy`` (>= 1).
        debug_overflow (bool): record, on each overflowing step, which parameters'
            gradients were non-finite and whether the loss was; log it and keep it
            in :attr:`overflow_reports`. Off by default, and then costs nothing.
        extra_outputs (bool): also return the learning rate the step used and the global
            L2 norm of the unscaled gradients (mindformers' outputs). Default False.
        lr_per_micro_batch (bool): with accumulation, advance the optimizer's
            ``global_step`` (and so a learning-rate schedule) on every micro-batch, as
            mindcv and mindone do, instead of once per optimizer step (MindSpore's and
            PyTorch's meaning, the default).

    Inputs:
        ``*inputs``: the network's inputs.

    Outputs:
        ``(loss, overflow, loss_scale)``: the (micro-batch) loss, a bool scalar
        (with accumulation: the window's decision on its last micro-batch, False on
        the others), and the ``scale_sense`` Parameter after this step's update (the
        scale the next step uses), as MindSpore's cell returns it. With
        ``extra_outputs``: ``(loss, overflow, loss_scale, learning_rate, global_norm)``.

    Before its first step the cell checks its loss-scale state on the host
    (:meth:`check_state`): a state loaded from a checkpoint of another configuration,
    or an inf scale written by MindSpore's own cell, is refused with a ``ValueError``.

    Example:
        >>> import numpy as np
        >>> import mindspore as ms
        >>> from mindspore import nn
        >>> from lossscale import DynamicLossScaleManager, TrainOneStepWithLossScaleCell
        >>> net = nn.WithLossCell(nn.Dense(4, 1), nn.MSELoss())
        >>> opt = nn.Momentum(net.trainable_params(), learning_rate=0.1, momentum=0.9)
        >>> manager = DynamicLossScaleManager(init_loss_scale=2**12, scale_window=1000)
        >>> step = TrainOneStepWithLossScaleCell(net, opt, manager.get_update_cell(), clip_global_norm=1.0)
        >>> x, y = ms.Tensor(np.ones((2, 4), np.float32)), ms.Tensor(np.ones((2, 1), np.float32))
        >>> loss, overflow, scale = step(x, y)
        >>> bool(overflow), float(scale), step.overflow_counters()["steps"]
        (False, 4096.0, 1)
    """

    def __init__(
        self,
        network,
        optimizer,
        scale_sense,
        *,
        drop_overflow_update=True,
        overflow_check=None,
        clip_global_norm=None,
        accumulation_steps=1,
        overflow_policy="skip",
        max_consecutive_overflows=None,
        debug_overflow=False,
        extra_outputs=False,
        lr_per_micro_batch=False,
    ):
        check_train_arguments(network, optimizer, scale_sense)
        refuse_bfloat16_on_cpu(tuple(parameter.dtype for parameter in optimizer.parameters))
        super().__init__(network, optimizer, sens=None)
        self._subclass_options, self._reassigned_options = {}, ()  # see built_option
        self._drop_overflow_update = check_bool("drop_overflow_update", drop_overflow_update)
        self._optimizer_unscales, self.loss_scaler = _scale_core(optimizer, scale_sense, overflow_check)
        self.scale_sense = self.loss_scaler.scale_value
        refuse_applied_overflows_with_a_dynamic_rule(self._drop_overflow_update, self.loss_scaler)
        self.clipper = None if clip_global_norm is None else GlobalNormClip(clip_global_norm)
        self._accumulation_steps, self._accumulation = _accumulation_of(self, accumulation_steps)
        self.checkpoint_receiver = CheckpointReceiver(self._accumulation is not None, self.loss_scaler.update_cell)
        self.persistent_overflow = PersistentOverflowPolicy(overflow_policy, max_consecutive_overflows)
        self.counters = OverflowCounters()
        self.forensics = OverflowForensics(self.weights) if check_debug_flag(debug_overflow) else None
        # Restored on a skipped step (only when skipped steps are dropped, and only if the network has any).
        self.running_statistics = RunningStatistics.of(network) if self._drop_overflow_update else None
        self._extra_outputs, self._lr_per_micro_batch = _output_options(optimizer, extra_outputs, lr_per_micro_batch)
        self._norm_decides = self.clipper is not None and self.overflow_check != ASCEND_SATURATION
        # A subclass that overrides get_overflow_status (MindSpore's extension point) is honoured.
        self._custom_status = type(self).get_overflow_status is not TrainOneStepWithLossScaleCell.get_overflow_status
        _add_mindspore_helpers(self)
        self._state_checked = False
        self._host_features = host_features(self)
        self._host_call_token = host_call_token()
        self._construct_only_options = construct_only_options(self, _DEFAULTS)

    # ---- public attributes (MindSpore's names) and host-side API --------------------------------
    @property
    def loss_scaling_manager(self):
        """The update cell deciding the scale, or None for a Tensor ``scale_sense`` (MindSpore's name). Assigning
        the one it holds changes nothing; another is refused (:meth:`__setattr__`)."""
        return self.loss_scaler.update_cell

    # The options are fixed when the cell is built: its compiled step would not see a new value (built_option).
    drop_overflow_update = built_option("drop_overflow_update")
    optimizer_unscales = built_option("optimizer_unscales")
    overflow_check = built_option("overflow_check", lambda self: self.loss_scaler.check.name)
    accumulation_steps = built_option("accumulation_steps")
    extra_outputs = built_option("extra_outputs")
    lr_per_micro_batch = built_option("lr_per_micro_batch")
    clip_global_norm = built_option(
        "clip_global_norm", lambda self: None if self.clipper is None else self.clipper.clip_norm
    )
    overflow_policy = built_option("overflow_policy", lambda self: self.persistent_overflow.policy)
    max_consecutive_overflows = built_option(
        "max_consecutive_overflows", lambda self: self.persistent_overflow.max_consecutive_overflows
    )
    debug_overflow = built_option("debug_overflow", lambda self: self.forensics is not None)
    overflow_reports = property(
        lambda self: [] if self.forensics is None else self.forensics.reports,
        doc="Forensics reports of overflowing steps (debug_overflow=True).",
    )
    # The accumulation part (None without one). Model-zoo accumulation cells assign the name as a flag of their own.
    accumulation = built_option("accumulation")
    accumulators = property(
        lambda self: self._accumulation.accumulators, doc="The float32 accumulators (float64 for float64 weights)."
    )
    steps = property(lambda self: self.counters.steps, doc="Counter Parameter: optimizer steps (windows).")
    skipped_steps = property(lambda self: self.counters.skipped_steps, doc="Counter Parameter: skipped steps.")
    consecutive_overflows = property(
        lambda self: self.counters.consecutive_overflows, doc="Counter Parameter: overflows in a row."
    )
    last_overflow_step = property(
        lambda self: self.counters.last_overflow_step,
        doc="Counter Parameter: 1-based step of the last overflow, 0 = never.",
    )

    def __call__(self, *args, **kwargs):
        self.loss_scaler.check_update_cell_owner()
        if not self._state_checked:
            self.check_state()
        if self._construct_only_options:  # a subclass's construct: compile (as the call would) and check ours ran
            self.compile(*args, **kwargs)
            refuse_options_without_construct(type(self), self._host_call_token, self._construct_only_options)
            self._construct_only_options = ()
        scale_used = self.get_loss_scale() if self.persistent_overflow.active else None
        with host_call(self._host_call_token):
            try:
                outputs = super().__call__(*args, **kwargs)
            except BaseException:
                compile_again_at_next_call(self)  # a graph that raised fails at every later call: once fixed, go on
                raise
        if self.persistent_overflow.active or self.forensics is not None:
            after_step(self, outputs, scale_used)
        return outputs

    def __setattr__(self, name, value):
        if name == "loss_scaling_manager":
            keep_update_cell(self, value)
            return
        super().__setattr__(name, value)

    def compile(self, *args, **kwargs):
        """Compile ahead of the first call (MindSpore's ``Cell.compile``; ``Model.build`` uses it): the graph is
        the one ``__call__`` runs, with its host-side checks."""
        with host_call(self._host_call_token):
            return super().compile(*args, **kwargs)

    # ---- host side (each call syncs at most once) -----------------------------------------------------------
    def set_sense_scale(self, sens):
        """Set the scale (host to device, no graph rebuild), within the update cell's rule: between a dynamic
        cell's ``min_loss_scale`` and ``max_loss_scale``; refused for a fixed scale that an update cell or the
        optimizer's ``loss_scale`` fixes."""
        write_parameter(self.scale_sense, checked_sense_scale(self, sens))

    def get_loss_scale(self):
        """The current scale held on the device, as a float (one host sync)."""
        return self.loss_scaler.get_scale()

    def overflow_counters(self):
        """In-graph counters as Python ints (one host sync): ``steps`` (optimizer steps, i.e. windows),
        ``skipped_steps``, ``consecutive_overflows``, ``last_overflow_step`` (1-based, 0 = never)."""
        return self.counters.as_dict()

    def state_dict(self):
        """The loss-scale state as Python numbers, ``{'loss_scale', 'good_steps', 'hysteresis_left'}`` (counters
        only with a dynamic update cell of lossscale's; one host sync)."""
        return self.loss_scaler.state_dict()

    def load_state_dict(self, state):
        """Restore :meth:`state_dict` output (validated against the update cell's rule; nothing changes on error).
        A fixed scale must be the one saved; a frozen scale (the optimizer divides by it) cannot change."""
        self.loss_scaler.load_state_dict(state)
        self.check_state()

    def check_state(self):
        """Raise ``ValueError`` if the loss-scale state (e.g. as a checkpoint loaded it) cannot be trained with
        (:func:`lossscale.training.checkpoints.check_cell_state`). Runs by itself before the first step; call it after
        loading a checkpoint into a cell that has already run. What a checkpoint of another configuration held
        (:class:`lossscale.training.checkpoints.CheckpointReceiver`) is refused or translated first. One host sync."""
        take_received_state(self)
        check_cell_state(self)
        self.state_checked()

    def state_checked(self):
        """Record that the state was checked (by :meth:`check_state` or a validated load)."""
        self._state_checked = True

    def checkpoint_choice(self):
        """A ``choice_func`` for ``mindspore.save_checkpoint`` that leaves out the accumulators when they are
        empty, at each save it serves (:func:`lossscale.training.checkpoints.checkpoint_choice`)."""
        return checkpoint_choice(self)

    # ---- graph -------------------------------------------------------------------------------
    def construct(self, *inputs):
        if self._construct_only_options:
            mark_own_construct_traced(self._host_call_token)
        if self._reassigned_options:
            refuse_reassigned_options(self._reassigned_options)
        if self._host_features:
            refuse_without_host_call(self._host_call_token, self._host_features)
        saved = None if self.running_statistics is None else self.running_statistics.save()
        loss = check_loss_output(self.network(*inputs))
        scaling_sens = self.scale_sense
        status, scaling_sens = self.start_overflow_check(loss, scaling_sens)
        grads = self.grad(self.network, self.weights)(*inputs, self.loss_scaler.sens(loss, scaling_sens))
        if self.forensics is not None:
            keep = self._false if self._accumulation is None else self._accumulation.micro_step > 0
            grads = ops.depend(grads, self.forensics.record(grads, loss, keep))
        if not self._optimizer_unscales:
            grads = self.loss_scaler.unscale(grads, scaling_sens)
        if self._accumulation is not None:
            return self._accumulation_step(loss, status, grads, scaling_sens, saved)
        grads = self.grad_reducer(grads)
        flag = self._zero if self._norm_decides and not self._custom_status else self._flag(status, grads)
        flag = _with_loss_flag(self.loss_scaler, self._drop_overflow_update, flag, loss)
        overflow, norm, learning_rate = self._finish_step(flag, grads)
        overflow = _restored_if(self.running_statistics, overflow, saved)
        return _outputs(self._extra_outputs, loss, overflow, scaling_sens, learning_rate, norm)

    def _flag(self, status, grads):
        """This rank's float32 flag for ``grads``: the backend check, or an overridden get_overflow_status."""
        if self._custom_status:
            return ops.select(self.get_overflow_status(status, grads), self._one, self._zero)
        return self.loss_scaler.flag(status, grads)

    def _accumulation_step(self, loss, status, grads, scaling_sens, saved):
        micro_flag = _with_loss_flag(self.loss_scaler, self._drop_overflow_update, self._flag(status, grads), loss)
        if self.running_statistics is not None:
            # This micro-batch's own running statistics go if its own loss or gradients overflowed (on this rank).
            micro_flag = ops.depend(micro_flag, _restored_if(self.running_statistics, micro_flag != self._zero, saved))
        window_flag, micro, last = self._accumulation.add(grads, micro_flag)
        if last:
            mean = self.grad_reducer(self._accumulation.mean(self.weights))
            # Finite micro-batch gradients can still sum to inf in float32: the window's mean is checked too.
            window_flag = window_flag + gradients.nonfinite_indicator(self.hyper_map, mean)
            overflow, norm, learning_rate = self._finish_step(window_flag, mean)
            overflow = ops.depend(overflow, self._accumulation.reset())
            if self._lr_per_micro_batch and self._drop_overflow_update:  # a skipped window's last micro-batch counts
                overflow = ops.depend(
                    overflow, ops.assign_add(self.optimizer.global_step, ops.cast(overflow, mstype.int32))
                )
        else:
            done = self._accumulation.carry(window_flag, micro)
            if self._lr_per_micro_batch:
                done = ops.depend(done, ops.assign_add(self.optimizer.global_step, Tensor(1, mstype.int32)))
            overflow = ops.depend(self._false, done)
            norm, learning_rate = _reported(self, grads)
        return _outputs(self._extra_outputs, loss, overflow, scaling_sens, learning_rate, norm)

    def _finish_step(self, flag, grads):
        """Decide (clip norm and/or check flag, all-reduced once), update scale and counters, step or skip.

        Returns ``(overflow, global norm, learning rate)``; the last two are 0 unless clipping computes the
        norm or ``extra_outputs`` asks for them."""
        norm = None
        statistics = self.loss_scaler.statistics(grads, self._one if self._optimizer_unscales else None)
        if self.clipper is not None:
            grads, norm_flag, norm = self.clipper(grads, _as_applied(self, grads))
            flag = flag + norm_flag
        norm, learning_rate = _reported(self, grads, norm)
        overflow = self.loss_scaler.is_overflow(flag)
        overflow = self.process_loss_scale(overflow, statistics) if statistics else self.process_loss_scale(overflow)
        overflow = ops.depend(overflow, self.counters.count(overflow, self._drop_overflow_update))
        if self._drop_overflow_update:
            if not overflow:
                overflow = ops.depend(overflow, self.optimizer(grads))
            else:
                overflow = ops.depend(overflow, _refuse_non_finite_scale(self.loss_scaler.scale_value))
        else:
            overflow = ops.depend(overflow, self.optimizer(grads))
        return overflow, norm, learning_rate

    def start_overflow_check(self, pre_cond, compute_input):
        """Prepare the check after ``pre_cond`` (Ascend saturation mode: clear the float status).

        Returns ``(status, compute_input)``; pass ``status`` to :meth:`get_overflow_status`.
        """
        return self.loss_scaler.start(pre_cond, compute_input)

    def get_overflow_status(self, status, compute_output):
        """A bool scalar: True if any tensor of ``compute_output`` is inf/nan (on any rank)."""
        return self.loss_scaler.is_overflow(self.loss_scaler.flag(status, compute_output))

    def process_loss_scale(self, overflow, statistics=()):
        """Call the update cell (if any) with the scale Parameter (and the gradient statistics its rule reads);
        return the overflow flag."""
        return apply_rule(self.loss_scaler, overflow, statistics)


TrainOneStepWithLossScaleCell.OWN_CONSTRUCT = TrainOneStepWithLossScaleCell.construct
_DEFAULTS = {
    name: p.default for name, p in inspect.signature(TrainOneStepWithLossScaleCell.__init__).parameters.items()
}


def _scale_core(optimizer, scale_sense, overflow_check):
    """``(optimizer_unscales, core)``: the loss-scaling core for ``scale_sense``. When the optimizer divides by the
    scale itself, the scale is a constant, as MindSpore's Python-float sens: a checkpoint written at another scale
    cannot change it while the optimizer keeps dividing by this one."""
    optimizer_unscales = check_optimizer_loss_scale(optimizer, fixed_scale_of(scale_sense))
    return optimizer_unscales, LossScaler(scale_sense, overflow_check=overflow_check, frozen=optimizer_unscales)


def _accumulation_of(cell, accumulation_steps):
    """``(accumulation_steps, part)``: the steps checked and the accumulation part of ``cell`` (None for one
    micro-batch per step), its micro-step bound to the update cell for the manager's counts."""
    accumulation_steps = check_int_in_range("accumulation_steps", accumulation_steps, low=1)
    if accumulation_steps == 1:
        return accumulation_steps, None
    accumulation = GradientAccumulation(cell.weights, accumulation_steps)
    update_cell = cell.loss_scaler.update_cell
    if hasattr(update_cell, "bind_micro_step"):
        update_cell.bind_micro_step(accumulation.micro_step)
    return accumulation_steps, accumulation


# ---- graph helpers of the step --------------------------------------------------------------------------------
def _restored_if(running_statistics, skipped, saved):
    """Write back the running statistics saved before the forward pass if ``skipped``; returns ``skipped``."""
    if running_statistics is None:
        return skipped
    return ops.depend(skipped, running_statistics.restore_if(skipped, saved))


def _with_loss_flag(loss_scaler, drop_overflow_update, flag, loss):
    """Count a non-finite loss as an overflow (when overflowing steps are dropped); it reaches every rank through
    the flag's all-reduce, whatever the backend's check."""
    if drop_overflow_update:
        return flag + loss_scaler.loss_flag(loss)
    return flag


def _outputs(extra_outputs, loss, overflow, scaling_sens, learning_rate, norm):
    """MindSpore's ``(loss, overflow, scale)``; with ``extra_outputs`` also the learning rate the step used and the
    global norm of the unscaled gradients (mindformers' order)."""
    if extra_outputs:
        return loss, overflow, scaling_sens, learning_rate, norm
    return loss, overflow, scaling_sens


def _as_applied(cell, grads):
    """``grads`` unscaled, as the optimizer will apply them: unscaled by the cell, except that an optimizer that
    divides by the fixed scale itself receives them scaled, so that their norm is measured on an unscaled copy."""
    return cell.loss_scaler.unscale(grads) if cell._optimizer_unscales else grads


def _reported(cell, grads, norm=None):
    """``(global norm, learning rate)`` for ``extra_outputs``, read before the optimizer steps: the norm clipping
    computed (``norm``) or that of the unscaled ``grads``; zeros when the outputs are not asked for."""
    if not cell._extra_outputs:
        return (cell._zero if norm is None else norm), cell._zero
    if norm is None:
        norm = global_norm(cell.hyper_map, _as_applied(cell, grads))
    return norm, cell.optimizer.get_lr()


def _refuse_non_finite_scale(scale):
    """Graph, in the branch that skips a step (after the rule ran: a dynamic rule brings an inf scale back within
    its bounds): ``ValueError`` if the scale is not finite. A non-finite fixed scale written into a running cell
    (``load_param_into_net``, ``Parameter.set_data``) would skip every step from then on. The train cell compiles a
    new graph at its next call, so once a finite scale is written back it trains on."""
    scale = scale.reshape(())
    if not ops.isfinite(scale):
        raise ValueError(
            "the loss scale is not finite (it was written into the running cell, by load_param_into_net or "
            "set_data?): every step would be skipped. Write a finite scale back with load_state_dict({'loss_scale': "
            "S}) (a fixed update cell: its own S) or set_sense_scale(), and the cell trains on."
        )
    return scale
