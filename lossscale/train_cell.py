"""``TrainOneStepWithLossScaleCell``: one compiled graph that scales, checks, unscales and steps.

Per call (one training step, no host sync inside the graph)::

    loss  = network(*inputs)
    sens  = loss scale, cast to the loss dtype
    grads = d(loss * sens)/d(weights)                   # backward on the scaled loss
    grads = grads * (1 / scale)                         # in float32, cast back to each grad's dtype
    grads = grad_reducer(grads)                         # all-reduce under data parallel
    overflow = some grad is inf/nan or loss is inf/nan  # backend-specific check, see lossscale.overflow
    overflow = all-reduce(overflow) under data parallel # every rank takes the same decision
    update cell(scale, overflow)                        # dynamic: back off / grow
    if not overflow: optimizer(grads)                   # skip = weights, moments and the
                                                        # optimizer's global step are untouched

"Skip" means the optimizer is not called at all: no weight, moment or
``global_step`` changes, so a learning-rate schedule driven by the optimizer's
step counter does not advance on skipped steps (as in MindSpore and PyTorch).
"""
import numpy as np
from mindspore import Parameter, Tensor, nn, ops
from mindspore.common import dtype as mstype
from mindspore.communication.management import GlobalComm
from mindspore.context import ParallelMode
from mindspore.ops.operations.math_ops import NPUClearFloatStatusV2, NPUGetFloatStatusV2
from mindspore.ops.operations.nn_ops import AllFinite

from lossscale._validation import check_bool
from lossscale import overflow as _overflow
from lossscale.update_cells import FixedLossScaleUpdateCell


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
        value = scale_sense.asnumpy().astype(np.float32)
        if not (np.isfinite(value).all() and (value > 0).all()):
            raise ValueError(f"'scale_sense' must be finite and > 0, but got {value.reshape(-1)[0]!r}.")
        return Parameter(Tensor(value), name="scale_sense", requires_grad=False), None
    raise TypeError(f"'scale_sense' must be an update Cell or a Tensor, but got {type(scale_sense).__name__}.")


class TrainOneStepWithLossScaleCell(nn.TrainOneStepCell):
    r"""Training step with loss scaling that runs on CPU, GPU and Ascend.

    A drop-in for ``mindspore.nn.TrainOneStepWithLossScaleCell`` (same arguments,
    outputs and overridable methods ``start_overflow_check``,
    ``get_overflow_status``, ``process_loss_scale``) that also runs on CPU, unscales
    in float32 (MindSpore casts ``1/scale`` to the gradient dtype, which is 0 in
    float16 once the scale reaches 2**25), counts a non-finite loss as an overflow,
    and refuses an optimizer whose own ``loss_scale`` would unscale a second time.

    Args:
        network (Cell): network with loss; single output.
        optimizer (Cell): the optimizer. Its ``loss_scale`` must be 1 (default),
            except with a fixed scale equal to it (MindSpore's
            ``FixedLossScaleManager(S, False)`` convention), in which case the
            optimizer unscales and this cell does not.
        scale_sense (Union[Cell, Tensor]): an update cell (e.g.
            :class:`lossscale.DynamicLossScaleUpdateCell`, or MindSpore's) or a
            float32 Tensor of shape () or (1,) changed with :meth:`set_sense_scale`.
        drop_overflow_update (bool): keyword only. Skip the optimizer on overflow
            (default). False applies every step (``FixedLossScaleManager(S, False)``).
        overflow_check (str): keyword only; one of
            :data:`lossscale.overflow.OVERFLOW_CHECKS`. Default: chosen from the
            device target by :func:`lossscale.overflow.current_overflow_check`.

    Inputs:
        ``*inputs``: the network's inputs.

    Outputs:
        ``(loss, overflow, loss_scale)``: the unscaled loss, a bool scalar, and the
        ``scale_sense`` Parameter after this step's update (the scale the next
        step uses), as MindSpore's cell returns it.

    Example:
        >>> import numpy as np
        >>> import mindspore as ms
        >>> from mindspore import nn
        >>> from lossscale import DynamicLossScaleManager, TrainOneStepWithLossScaleCell
        >>> net = nn.WithLossCell(nn.Dense(4, 1), nn.MSELoss())
        >>> opt = nn.Momentum(net.trainable_params(), learning_rate=0.1, momentum=0.9)
        >>> manager = DynamicLossScaleManager(init_loss_scale=2**12, scale_window=1000)
        >>> step = TrainOneStepWithLossScaleCell(net, opt, manager.get_update_cell())
        >>> x, y = ms.Tensor(np.ones((2, 4), np.float32)), ms.Tensor(np.ones((2, 1), np.float32))
        >>> loss, overflow, scale = step(x, y)
        >>> bool(overflow), float(scale)
        (False, 4096.0)
    """

    def __init__(self, network, optimizer, scale_sense, *, drop_overflow_update=True, overflow_check=None):
        super().__init__(network, optimizer, sens=None)
        self.hyper_map = ops.HyperMap()
        self.scale_sense, self.loss_scaling_manager = _scale_parameter(scale_sense)
        if self.loss_scaling_manager is not None and hasattr(self.loss_scaling_manager, "bind_scale_parameter"):
            self.loss_scaling_manager.bind_scale_parameter(self.scale_sense)
        self.drop_overflow_update = check_bool("drop_overflow_update", drop_overflow_update)
        self.optimizer_unscales = self._optimizer_unscales(optimizer, scale_sense)
        if overflow_check is None:
            overflow_check = _overflow.current_overflow_check()
        if overflow_check not in _overflow.OVERFLOW_CHECKS:
            raise ValueError(f"'overflow_check' must be one of {_overflow.OVERFLOW_CHECKS}, "
                             f"but got {overflow_check!r}.")
        self.overflow_check = overflow_check
        self.is_distributed = self.parallel_mode in (ParallelMode.DATA_PARALLEL, ParallelMode.HYBRID_PARALLEL)
        if self.is_distributed:
            self.allreduce = ops.AllReduce(ops.ReduceOp.SUM, GlobalComm.WORLD_COMM_GROUP)
        self._zero = Tensor(0.0, mstype.float32)
        self._one = Tensor(1.0, mstype.float32)
        self._zero_status = Tensor([0] * 8, mstype.int32)

    def _optimizer_unscales(self, optimizer, scale_sense):
        """True if the optimizer divides by the (fixed) scale itself; reject any other ``loss_scale``."""
        optimizer_scale = float(getattr(optimizer, "loss_scale", 1.0))
        if optimizer_scale == 1.0:
            return False
        fixed = self.loss_scaling_manager is None or isinstance(
            self.loss_scaling_manager, (FixedLossScaleUpdateCell, nn.FixedLossScaleUpdateCell))
        if fixed and optimizer_scale == float(self.scale_sense.asnumpy().reshape(-1)[0]):
            return True
        raise ValueError(
            f"'optimizer.loss_scale' is {optimizer_scale!r} but the loss scale is "
            f"{'dynamic' if not fixed else float(self.scale_sense.asnumpy().reshape(-1)[0])}: the gradients "
            f"would be unscaled twice or by the wrong factor. Build the optimizer without 'loss_scale' "
            f"(this cell unscales), or give it exactly the fixed loss scale.")

    def set_sense_scale(self, sens):
        """Set the scale of a cell built with a Tensor ``scale_sense`` (host to device, no graph rebuild)."""
        if not isinstance(sens, Tensor):
            raise TypeError(f"'sens' must be a Tensor, but got {type(sens).__name__}.")
        if sens.shape != self.scale_sense.shape:
            raise ValueError(f"'sens' must have shape {self.scale_sense.shape}, but got {sens.shape}.")
        value = sens.asnumpy().astype(np.float32)
        if not (np.isfinite(value).all() and (value > 0).all()):
            raise ValueError(f"'sens' must be finite and > 0, but got {value.reshape(-1)[0]!r}.")
        if self.optimizer_unscales:
            raise ValueError("'set_sense_scale' cannot change the scale: the optimizer was built with "
                             "loss_scale equal to the fixed scale and divides by it.")
        self.scale_sense.set_data(Tensor(value))

    def get_loss_scale(self):
        """The current scale held on the device, as a float (one host sync)."""
        return float(self.scale_sense.asnumpy().reshape(-1)[0])

    def construct(self, *inputs):
        loss = self.network(*inputs)
        scaling_sens = self.scale_sense
        status, scaling_sens = self.start_overflow_check(loss, scaling_sens)
        sens = ops.ones_like(loss) * ops.cast(scaling_sens.reshape(()), ops.dtype(loss))
        grads = self.grad(self.network, self.weights)(*inputs, sens)
        if not self.optimizer_unscales:
            inv_scale = self._one / ops.cast(scaling_sens.reshape(()), mstype.float32)
            grads = _overflow.unscale_gradients(self.hyper_map, inv_scale, grads)
        grads = self.grad_reducer(grads)
        cond = self.get_overflow_status(status, grads)
        cond = ops.logical_or(cond, ops.logical_not(ops.isfinite(loss).all()))
        overflow = self.process_loss_scale(cond)
        if self.drop_overflow_update:
            if not overflow:
                loss = ops.depend(loss, self.optimizer(grads))
        else:
            loss = ops.depend(loss, self.optimizer(grads))
        return loss, cond, scaling_sens

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

    def get_overflow_status(self, status, compute_output):
        """A bool scalar: True if any tensor of ``compute_output`` is inf/nan (on any rank)."""
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
            indicator = _overflow.nonfinite_indicator(self.hyper_map, compute_output)
            flag = ops.select(ops.isfinite(indicator), self._zero, self._one)
        if self.is_distributed:
            flag = self.allreduce(flag)
        return flag > self._zero

    def process_loss_scale(self, overflow):
        """Call the update cell (if any) with the scale Parameter; return the overflow flag."""
        if self.loss_scaling_manager is not None:
            return self.loss_scaling_manager(self.scale_sense, overflow)
        return overflow
