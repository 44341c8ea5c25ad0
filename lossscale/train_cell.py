"""``TrainOneStepWithLossScaleCell``: one compiled graph that scales, checks, unscales and steps.

Per call (one training step, no host sync inside the graph)::

    loss  = network(*inputs)
    sens  = loss scale, cast to the loss dtype
    grads = d(loss * sens)/d(weights)                   # backward on the scaled loss
    grads = grads * (1 / scale)                         # in float32, cast back to each grad's dtype
    grads = grad_reducer(grads)                         # all-reduce under data parallel
    overflow = some grad is inf/nan                     # backend-specific check, see lossscale.overflow
                                                        # (with clipping: the global norm is not finite)
               or the loss is inf/nan
    overflow = all-reduce(overflow) under data parallel # every rank takes the same decision
    update cell(scale, overflow)                        # dynamic: back off / grow
    counters: steps, skipped, consecutive overflows, last overflow step (saturating int32)
    if not overflow: optimizer(clip(grads))             # skip = weights, moments and the
                                                        # optimizer's global step are untouched

With ``accumulation_steps=N`` each call is one micro-batch: its unscaled
gradients are added to float32 accumulators and its overflow flag to a window
flag; on the N-th call the mean of the accumulators goes through the rest of the
pipeline above (one all-reduce, one scale update, one optimizer step) and the
accumulators are reset. The scale is constant within a window.

"Skip" means the optimizer is not called at all: no weight, moment or
``global_step`` changes, so a learning-rate schedule driven by the optimizer's
step counter does not advance on skipped steps (as in MindSpore and PyTorch).
"""
import logging
import warnings

import numpy as np
from mindspore import Parameter, ParameterTuple, Tensor, get_context, nn, ops
from mindspore.common import dtype as mstype
from mindspore.communication.management import GlobalComm
from mindspore.context import ParallelMode
from mindspore.ops.operations.math_ops import NPUClearFloatStatusV2, NPUGetFloatStatusV2
from mindspore.ops.operations.nn_ops import AllFinite

from lossscale import overflow as _overflow
from lossscale._validation import check_bool, check_finite_in_range, check_int_in_range
from lossscale.update_cells import DynamicLossScaleUpdateCell, FixedLossScaleUpdateCell

INT32_MAX = 2**31 - 1
OVERFLOW_POLICIES = ("skip", "warn", "raise")
_LOGGER = logging.getLogger("lossscale")

_square_sum = ops.MultitypeFuncGraph("_square_sum")


@_square_sum.register("Tensor")
def _tensor_square_sum(grad):
    grad = ops.cast(grad, mstype.float32)
    return ops.reduce_sum(grad * grad)


_clip = ops.MultitypeFuncGraph("_clip")


@_clip.register("Tensor", "Tensor")
def _tensor_clip(factor, grad):
    return ops.cast(ops.cast(grad, mstype.float32) * factor, ops.dtype(grad))


_accumulate = ops.MultitypeFuncGraph("_accumulate")


@_accumulate.register("Tensor", "Tensor")
def _tensor_accumulate(accumulator, grad):
    return ops.assign_add(accumulator, ops.cast(grad, mstype.float32))


_mean_of = ops.MultitypeFuncGraph("_mean_of")


@_mean_of.register("Tensor", "Tensor", "Tensor")
def _tensor_mean_of(inverse_count, accumulator, weight):
    return ops.cast(accumulator * inverse_count, ops.dtype(weight))


_reset = ops.MultitypeFuncGraph("_reset")


@_reset.register("Tensor")
def _tensor_reset(accumulator):
    return ops.assign(accumulator, ops.zeros_like(accumulator))


class PersistentOverflowError(RuntimeError):
    """Raised by ``overflow_policy="raise"`` when overflows persist (see the train cell).

    The message gives the step, the reason (consecutive count or minimum scale), the
    scale, the skipped-step count and what to try.

    Example:
        >>> issubclass(PersistentOverflowError, RuntimeError)
        True
    """


def _positive_scale_value(name, tensor):
    """``tensor`` as a float32 array whose values are finite and > 0 (else ``ValueError``)."""
    value = tensor.asnumpy().astype(np.float32)
    if not (np.isfinite(value).all() and (value > 0).all()):
        raise ValueError(f"'{name}' must be finite and > 0, but got {value.reshape(-1)[0]!r}.")
    return value


def _scale_parameter(scale_sense):
    """Validate ``scale_sense`` (update Cell or Tensor) and build the float32 scale Parameter."""
    if isinstance(scale_sense, nn.Cell):
        if not hasattr(scale_sense, "get_loss_scale"):
            raise TypeError(f"'scale_sense' Cell must have a get_loss_scale() method (an update cell), "
                            f"but got {type(scale_sense).__name__}.")
        value = Tensor(np.float32(scale_sense.get_loss_scale()), mstype.float32)
        return Parameter(value, name="scale_sense", requires_grad=False), scale_sense
    if isinstance(scale_sense, Tensor):
        if scale_sense.shape not in ((), (1,)):
            raise ValueError(f"'scale_sense' Tensor must have shape () or (1,), but got shape {scale_sense.shape}.")
        value = _positive_scale_value("scale_sense", scale_sense)
        return Parameter(Tensor(value), name="scale_sense", requires_grad=False), None
    raise TypeError(f"'scale_sense' must be an update Cell or a Tensor, but got {type(scale_sense).__name__}.")


def _refuse_sparse_gradients_on_cpu(network):
    """Raise ``ValueError`` if ``network`` has cells that produce sparse gradients and the target is CPU.

    ``nn.EmbeddingLookup(sparse=True)`` (the only choice with ``target="CPU"``) makes RowTensor
    gradients. On MindSpore 2.10's CPU backend a graph that applies them under the overflow
    condition next to the loss-scale state updates ends in a segmentation fault (reproduced here
    with ``LazyAdam``, with a dynamic update cell or a fixed Tensor scale), so it is refused
    with an error instead of killing the process.
    """
    if get_context("device_target") != "CPU":
        return
    sparse = [name or type(network).__name__ for name, cell in network.cells_and_names()
              if isinstance(cell, nn.EmbeddingLookup) and getattr(cell, "sparse", False)]
    if sparse:
        raise ValueError(
            f"'network' has cells with sparse (RowTensor) gradients: {', '.join(sparse)} "
            f"(nn.EmbeddingLookup with sparse=True). On CPU, MindSpore 2.10 crashes with a segmentation fault "
            f"when such gradients are applied in a graph that also updates the loss-scale state. Use nn.Embedding, "
            f"whose gradients are dense, or train this network without loss scaling.")


def _counter(name, value=0, dtype=mstype.int32):
    return Parameter(Tensor(value, dtype), name=name, requires_grad=False)


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
        optimizer (Cell): the optimizer. Its ``loss_scale`` must be 1 (default),
            except with a fixed scale equal to it (MindSpore's
            ``FixedLossScaleManager(S, False)`` convention), in which case the
            optimizer unscales and this cell does not.
        scale_sense (Union[Cell, Tensor]): an update cell (e.g.
            :class:`lossscale.DynamicLossScaleUpdateCell`, or MindSpore's) or a
            float32 Tensor of shape () or (1,) changed with :meth:`set_sense_scale`.

    Keyword Args:
        drop_overflow_update (bool): skip the optimizer on overflow (default). False
            applies every step (``FixedLossScaleManager(S, False)``).
        overflow_check (str): one of :data:`lossscale.overflow.OVERFLOW_CHECKS`.
            Default: chosen from the device target by
            :func:`lossscale.overflow.current_overflow_check`.
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
            Checked on the host after each call (one sync per step).
        max_consecutive_overflows (int, optional): see ``overflow_policy`` (>= 1).
        debug_overflow (bool): record, on each overflowing step, which parameters'
            gradients were non-finite and whether the loss was; log it and keep it
            in :attr:`overflow_reports`. Off by default, and then costs nothing.

    Inputs:
        ``*inputs``: the network's inputs.

    Outputs:
        ``(loss, overflow, loss_scale)``: the (micro-batch) loss, a bool scalar
        (with accumulation: the window's decision on its last micro-batch, False on
        the others), and the ``scale_sense`` Parameter after this step's update (the
        scale the next step uses), as MindSpore's cell returns it.

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

    def __init__(self, network, optimizer, scale_sense, *, drop_overflow_update=True, overflow_check=None,
                 clip_global_norm=None, accumulation_steps=1, overflow_policy="skip",
                 max_consecutive_overflows=None, debug_overflow=False):
        _refuse_sparse_gradients_on_cpu(network)
        super().__init__(network, optimizer, sens=None)
        self.hyper_map = ops.HyperMap()
        self.scale_sense, self.loss_scaling_manager = _scale_parameter(scale_sense)
        if self.loss_scaling_manager is not None and hasattr(self.loss_scaling_manager, "bind_scale_parameter"):
            self.loss_scaling_manager.bind_scale_parameter(self.scale_sense)
        self.drop_overflow_update = check_bool("drop_overflow_update", drop_overflow_update)
        self.optimizer_unscales = self._optimizer_unscales(optimizer)
        self.overflow_check = self._resolve_overflow_check(overflow_check)
        self.clip_global_norm = None if clip_global_norm is None else check_finite_in_range(
            "clip_global_norm", clip_global_norm, low=0.0, low_inclusive=False)
        self.accumulation_steps = check_int_in_range("accumulation_steps", accumulation_steps, low=1)
        self._configure_overflow_policy(overflow_policy, max_consecutive_overflows, debug_overflow)
        self.is_distributed = self.parallel_mode in (ParallelMode.DATA_PARALLEL, ParallelMode.HYBRID_PARALLEL)
        if self.is_distributed:
            self.allreduce = ops.AllReduce(ops.ReduceOp.SUM, GlobalComm.WORLD_COMM_GROUP)
        self._norm_decides = self.clip_global_norm is not None and self.overflow_check != _overflow.ASCEND_SATURATION
        # A subclass that overrides get_overflow_status (MindSpore's extension point) is honoured.
        self._custom_status = type(self).get_overflow_status is not TrainOneStepWithLossScaleCell.get_overflow_status
        self._zero = Tensor(0.0, mstype.float32)
        self._one = Tensor(1.0, mstype.float32)
        self._int_zero = Tensor(0, mstype.int32)
        self._int_one = Tensor(1, mstype.int32)
        self._int_max = Tensor(INT32_MAX, mstype.int32)
        self._zero_status = Tensor([0] * 8, mstype.int32)
        self._false = Tensor(False, mstype.bool_)
        self.steps = _counter("loss_scale_steps")
        self.skipped_steps = _counter("loss_scale_skipped_steps")
        self.consecutive_overflows = _counter("loss_scale_consecutive_overflows")
        self.last_overflow_step = _counter("loss_scale_last_overflow_step")
        if self.accumulation_steps > 1:
            self.accumulators = ParameterTuple([
                Parameter(Tensor(np.zeros(p.shape, np.float32)), name=f"loss_scale_accumulator.{p.name}",
                          requires_grad=False) for p in self.weights])
            self.micro_step = _counter("loss_scale_micro_step")
            self.window_overflow = _counter("loss_scale_window_overflow", 0.0, mstype.float32)
            self._inverse_count = Tensor(1.0 / self.accumulation_steps, mstype.float32)
            self._window = Tensor(self.accumulation_steps, mstype.int32)
        if self.debug_overflow:
            self.nonfinite_grads = Parameter(Tensor(np.zeros(len(self.weights), np.bool_)),
                                             name="loss_scale_nonfinite_grads", requires_grad=False)
            self.nonfinite_loss = _counter("loss_scale_nonfinite_loss", False, mstype.bool_)
        self._host_scale = self.get_loss_scale()

    # ---- construction helpers --------------------------------------------------------------
    def _optimizer_unscales(self, optimizer):
        """True if the optimizer divides by the (fixed) scale itself; reject any other ``loss_scale``."""
        optimizer_scale = float(getattr(optimizer, "loss_scale", 1.0))
        if optimizer_scale == 1.0:
            return False
        fixed = self.loss_scaling_manager is None or isinstance(
            self.loss_scaling_manager, (FixedLossScaleUpdateCell, nn.FixedLossScaleUpdateCell))
        if fixed and optimizer_scale == self.get_loss_scale():
            return True
        raise ValueError(
            f"'optimizer.loss_scale' is {optimizer_scale!r} but the loss scale is "
            f"{self.get_loss_scale() if fixed else 'dynamic'}: the gradients would be unscaled twice or by the "
            f"wrong factor. Build the optimizer without 'loss_scale' (this cell unscales), or give it exactly "
            f"the fixed loss scale.")

    @staticmethod
    def _resolve_overflow_check(overflow_check):
        if overflow_check is None:
            return _overflow.current_overflow_check()
        if overflow_check not in _overflow.OVERFLOW_CHECKS:
            raise ValueError(f"'overflow_check' must be one of {_overflow.OVERFLOW_CHECKS}, "
                             f"but got {overflow_check!r}.")
        return overflow_check

    def _configure_overflow_policy(self, policy, max_consecutive, debug):
        if policy not in OVERFLOW_POLICIES:
            raise ValueError(f"'overflow_policy' must be one of {OVERFLOW_POLICIES}, but got {policy!r}.")
        if max_consecutive is not None:
            check_int_in_range("max_consecutive_overflows", max_consecutive, low=1)
            if policy == "skip":
                raise ValueError("'max_consecutive_overflows' needs overflow_policy='warn' or 'raise', "
                                 "but got overflow_policy='skip'.")
        self.overflow_policy = policy
        self.max_consecutive_overflows = max_consecutive
        self.debug_overflow = check_bool("debug_overflow", debug)
        self.overflow_reports = []
        self._warned = False

    # ---- host-side API -----------------------------------------------------------------------
    def set_sense_scale(self, sens):
        """Set the scale of a cell built with a Tensor ``scale_sense`` (host to device, no graph rebuild)."""
        if not isinstance(sens, Tensor):
            raise TypeError(f"'sens' must be a Tensor, but got {type(sens).__name__}.")
        if sens.shape != self.scale_sense.shape:
            raise ValueError(f"'sens' must have shape {self.scale_sense.shape}, but got {sens.shape}.")
        value = _positive_scale_value("sens", sens)
        if self.optimizer_unscales:
            raise ValueError("'set_sense_scale' cannot change the scale: the optimizer was built with "
                             "loss_scale equal to the fixed scale and divides by it.")
        self.scale_sense.set_data(Tensor(value))

    def get_loss_scale(self):
        """The current scale held on the device, as a float (one host sync)."""
        return float(self.scale_sense.asnumpy().reshape(-1)[0])

    def overflow_counters(self):
        """In-graph counters as Python ints (one host sync): ``steps`` (optimizer steps, i.e. windows),
        ``skipped_steps``, ``consecutive_overflows``, ``last_overflow_step`` (1-based, 0 = never)."""
        return {"steps": int(self.steps.asnumpy()), "skipped_steps": int(self.skipped_steps.asnumpy()),
                "consecutive_overflows": int(self.consecutive_overflows.asnumpy()),
                "last_overflow_step": int(self.last_overflow_step.asnumpy())}

    def __call__(self, *args, **kwargs):
        outputs = super().__call__(*args, **kwargs)
        if self.overflow_policy != "skip" or self.debug_overflow:
            self._after_step(outputs)
        return outputs

    def _after_step(self, outputs):
        """Host check after a step (only with a warn/raise policy or debug_overflow): one sync."""
        overflow = bool(outputs[1].asnumpy())
        previous_scale, self._host_scale = self._host_scale, self.get_loss_scale()
        if not overflow:
            return
        if self.debug_overflow:
            self._report_overflow()
        if self.overflow_policy == "skip":
            return
        counters = self.overflow_counters()
        cell = self.loss_scaling_manager
        minimum = cell.policy.min_scale if isinstance(cell, DynamicLossScaleUpdateCell) else None
        at_minimum = minimum is not None and previous_scale <= np.float32(minimum)
        too_many = self.max_consecutive_overflows is not None and \
            counters["consecutive_overflows"] >= self.max_consecutive_overflows
        if at_minimum or too_many:
            self._persistent_overflow(counters, previous_scale, minimum, at_minimum)

    def _persistent_overflow(self, counters, scale, minimum, at_minimum):
        reason = (f"the loss scale is already at its minimum {minimum:g}" if at_minimum else
                  f"{counters['consecutive_overflows']} consecutive overflowing steps "
                  f"(max_consecutive_overflows={self.max_consecutive_overflows})")
        message = (f"Persistent overflow at step {counters['steps']}: {reason}; loss scale {scale:g}, "
                   f"{counters['skipped_steps']} steps skipped so far. Every overflowing step is skipped, so "
                   f"training is not progressing. Try: debug_overflow=True to name the parameters with "
                   f"non-finite gradients, check the inputs for inf/nan, lower the learning rate, clip "
                   f"gradients (clip_global_norm), keep the unstable layers in float32, or lower min_loss_scale.")
        if self.overflow_policy == "raise":
            raise PersistentOverflowError(message)
        if not self._warned:
            self._warned = True
            warnings.warn(message, RuntimeWarning, stacklevel=3)

    def _report_overflow(self):
        flags = self.nonfinite_grads.asnumpy()
        report = {"step": int(self.last_overflow_step.asnumpy()),
                  "loss_nonfinite": bool(self.nonfinite_loss.asnumpy()),
                  "parameters": [p.name for p, bad in zip(self.weights, flags) if bad]}
        self.overflow_reports.append(report)
        _LOGGER.warning("overflow at step %d: loss non-finite: %s; non-finite gradients: %s", report["step"],
                        report["loss_nonfinite"], ", ".join(report["parameters"]) or "none")

    # ---- graph -------------------------------------------------------------------------------
    def construct(self, *inputs):
        loss = self.network(*inputs)
        scaling_sens = self.scale_sense
        status, scaling_sens = self.start_overflow_check(loss, scaling_sens)
        sens = ops.ones_like(loss) * ops.cast(scaling_sens.reshape(()), ops.dtype(loss))
        grads = self.grad(self.network, self.weights)(*inputs, sens)
        if self.debug_overflow:
            grads = ops.depend(grads, self._record_forensics(grads, loss))
        if not self.optimizer_unscales:
            inv_scale = self._one / ops.cast(scaling_sens.reshape(()), mstype.float32)
            grads = _overflow.unscale_gradients(self.hyper_map, inv_scale, grads)
        if self.accumulation_steps > 1:
            return self._accumulation_step(loss, status, grads, scaling_sens)
        grads = self.grad_reducer(grads)
        if self._custom_status:
            flag = ops.select(self.get_overflow_status(status, grads), self._one, self._zero)
        elif self._norm_decides:
            flag = self._zero
        else:
            flag = self._local_overflow_flag(status, grads)
        overflow = self._finish_step(self._with_loss_flag(flag, loss), grads)
        return loss, overflow, scaling_sens

    def _with_loss_flag(self, flag, loss):
        """Count a non-finite loss as an overflow (when overflowing steps are dropped).

        Added to the local flag, it reaches every rank through the flag's all-reduce
        under data parallel, whatever the backend's check.
        """
        if self.drop_overflow_update:
            return flag + ops.cast(ops.reduce_sum(loss * 0), mstype.float32)  # 0, or nan
        return flag

    def _accumulation_step(self, loss, status, grads, scaling_sens):
        accumulated = self.hyper_map(_accumulate, self.accumulators, grads)
        flag = self._with_loss_flag(self._local_overflow_flag(status, grads), loss)
        window_flag = ops.depend(self.window_overflow + flag, accumulated)
        micro = self.micro_step + self._int_one
        overflow = self._false
        if micro >= self._window:
            mean = self.hyper_map(ops.partial(_mean_of, self._inverse_count), self.accumulators, self.weights)
            mean = self.grad_reducer(mean)
            overflow = self._finish_step(window_flag, mean)
            overflow = ops.depend(overflow, self.hyper_map(_reset, self.accumulators))
            overflow = ops.depend(overflow, ops.assign(self.window_overflow, self._zero))
            overflow = ops.depend(overflow, ops.assign(self.micro_step, self._int_zero))
        else:
            ops.assign(self.window_overflow, window_flag)
            ops.assign(self.micro_step, micro)
        return loss, overflow, scaling_sens

    def _finish_step(self, flag, grads):
        """Decide (clip norm and/or check flag, all-reduced once), update scale and counters, step or skip."""
        if self.clip_global_norm is not None:
            norm = ops.sqrt(ops.addn(self.hyper_map(_square_sum, grads)))
            flag = flag + ops.select(ops.isfinite(norm), self._zero, self._one)
            clip = self._one * self.clip_global_norm
            factor = clip / ops.maximum(norm, clip)  # as ops.clip_by_global_norm
            grads = self.hyper_map(ops.partial(_clip, factor), grads)
        if self.is_distributed:
            flag = self.allreduce(flag)
        overflow = self.process_loss_scale(ops.not_equal(flag, self._zero))
        overflow = ops.depend(overflow, self._count(overflow))
        if self.drop_overflow_update:
            if not overflow:
                overflow = ops.depend(overflow, self.optimizer(grads))
        else:
            overflow = ops.depend(overflow, self.optimizer(grads))
        return overflow

    def _count(self, overflow):
        """Update the saturating int32 counters (never wrap)."""
        steps = ops.select(self.steps < self._int_max, self.steps + self._int_one, self.steps)
        skipped = self.skipped_steps
        if self.drop_overflow_update:
            skipped = ops.select(ops.logical_and(overflow, skipped < self._int_max), skipped + self._int_one,
                                 skipped)
        consecutive = ops.select(overflow, ops.minimum(self.consecutive_overflows, self._int_max - self._int_one)
                                 + self._int_one, self._int_zero)
        last = ops.select(overflow, steps, self.last_overflow_step)
        done = ops.assign(self.steps, steps)
        done = ops.depend(done, ops.assign(self.skipped_steps, skipped))
        done = ops.depend(done, ops.assign(self.consecutive_overflows, consecutive))
        return ops.depend(done, ops.assign(self.last_overflow_step, last))

    def _record_forensics(self, grads, loss):
        """Debug mode: which raw gradients and whether the loss were non-finite (ORed over a window)."""
        per_tensor = ops.stack(_overflow.nonfinite_per_tensor(self.hyper_map, grads))
        loss_bad = ops.logical_not(ops.isfinite(loss).all())
        if self.accumulation_steps > 1:
            keep = self.micro_step > self._int_zero  # not the first micro-batch of the window
            per_tensor = ops.logical_or(ops.logical_and(self.nonfinite_grads, keep), per_tensor)
            loss_bad = ops.logical_or(ops.logical_and(self.nonfinite_loss, keep), loss_bad)
        done = ops.assign(self.nonfinite_grads, per_tensor)
        return ops.depend(done, ops.assign(self.nonfinite_loss, loss_bad))

    def start_overflow_check(self, pre_cond, compute_input):
        """Prepare the check; on Ascend saturation mode clear the float status after ``pre_cond``.

        Returns ``(status, compute_input)``; pass ``status`` to :meth:`get_overflow_status`.
        """
        status = self._zero_status
        if self.overflow_check == _overflow.ASCEND_SATURATION:
            status = ops.depend(status, pre_cond)
            clear_status = NPUClearFloatStatusV2()(status)
            compute_input = ops.depend(compute_input, clear_status)
        return status, compute_input

    def _local_overflow_flag(self, status, compute_output):
        """A float32 scalar, 0 when this rank's gradients are finite (before any all-reduce).

        Non-zero means overflow: a count (``FloatStatus``, the Ascend status register,
        ``AllFinite``) or nan (the exact CPU check). Sums and all-reduces keep it non-zero.
        """
        if self.overflow_check == _overflow.ASCEND_SATURATION:
            status = ops.depend(status, compute_output)
            flag = ops.cast(NPUGetFloatStatusV2()(status), mstype.float32).sum()
            status = ops.depend(status, flag)
            flag = ops.depend(flag, NPUClearFloatStatusV2()(status))
        elif self.overflow_check == _overflow.ASCEND_ALLFINITE:
            flag = ops.cast(AllFinite()(compute_output), mstype.float32)
        elif self.overflow_check == _overflow.FLOAT_STATUS:
            flag = _overflow.float_status_indicator(self.hyper_map, compute_output)
        else:
            flag = _overflow.nonfinite_indicator(self.hyper_map, compute_output)
        return flag

    def get_overflow_status(self, status, compute_output):
        """A bool scalar: True if any tensor of ``compute_output`` is inf/nan (on any rank)."""
        flag = self._local_overflow_flag(status, compute_output)
        if self.is_distributed:
            flag = self.allreduce(flag)
        return ops.not_equal(flag, self._zero)

    def process_loss_scale(self, overflow):
        """Call the update cell (if any) with the scale Parameter; return the overflow flag."""
        if self.loss_scaling_manager is not None:
            return self.loss_scaling_manager(self.scale_sense, overflow)
        return overflow
