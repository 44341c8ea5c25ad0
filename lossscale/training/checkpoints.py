"""The train cell's loss-scale state in checkpoints: validated after a load, restorable from a checkpoint that
was loaded into the bare network, and its empty accumulators left out.

A train cell's loss-scale state is every Parameter named ``scale_sense`` or ``loss_scale_*`` (the
update cell's counters, the overflow counters, the accumulation window and its accumulators), and the
counters of MindSpore's own update cell when the train cell uses one.
``mindspore.load_param_into_net`` writes whatever a checkpoint holds, so a checkpoint from another
configuration, or written by MindSpore's own cell after its scale grew to inf, can leave a state
this cell cannot train with. :func:`check_cell_state` refuses such a state with a ``ValueError``
naming the Parameter, its value and the allowed range; the train cell runs it before its first step
and after :func:`restore_loss_scale`. What a checkpoint of another configuration holds under names this
cell would not have (a mid-window micro-batch count, MindSpore's own step counters) is received by a
:class:`CheckpointReceiver` and treated as :func:`restore_loss_scale` treats it.

"""

import numpy as np
from mindspore import Tensor, nn
from mindspore.common import dtype as mstype

from lossscale.core._optimizers import is_loss_scale_optimizer
from lossscale.core._parameters import host_array, write_parameter
from lossscale.core._validation import check_int_in_range
from lossscale.core.rule import state_names
from lossscale.core.scaler import positive_scale
from lossscale.core.update_cells import LossScaleUpdateCell, mindspore_good_steps
from lossscale.training.accumulation import counter
from lossscale.training.bookkeeping import INT32_MAX

ACCUMULATOR_PREFIX = "loss_scale_accumulator."
MICRO_STEP = "loss_scale_micro_step"
# The Parameters of MindSpore's own DynamicLossScaleUpdateCell (a checkpoint of its train cell holds them).
MINDSPORE_COUNTERS = ("current_iterator_step", "last_overflow_iterator_step")
FRESH_MINDSPORE_COUNTERS = (1, 0)  # their values in a cell that has not run


def loss_scale_parameters(cell):
    """``{name: Parameter}`` of a train cell's loss-scale state: its scale, the update cell's Parameters (any rule's
    counters, under their names: MindFormers' for the adaptive window, MindSpore's in its own cell) and every
    ``loss_scale_*`` Parameter (counters, accumulation)."""
    update_cell = cell.loss_scaling_manager
    own = {parameter.name for parameter in update_cell.get_parameters()} if update_cell is not None else set()
    return {
        parameter.name: parameter
        for parameter in cell.get_parameters()
        if parameter.name == "scale_sense" or parameter.name.startswith("loss_scale_") or parameter.name in own
    }


def _counts_clean_steps(update_cell):
    """Whether ``update_cell`` is lossscale's, of a rule that counts clean steps (``good_steps``), which a checkpoint
    of MindSpore's own dynamic update cell translates into."""
    return isinstance(update_cell, LossScaleUpdateCell) and "good_steps" in state_names(update_cell.rule)


def _count(parameter):
    """A scalar int Parameter's (or checkpoint entry's) value as a Python int (one host sync)."""
    return int(host_array(parameter).reshape(-1)[0])


_FOREIGN_STATE = (
    "The loaded state does not belong to this train cell's configuration: load a checkpoint written by "
    "the same configuration, or call load_state_dict()/set_sense_scale() with valid values."
)


def check_cell_state(cell):
    """Raise ``ValueError`` if ``cell`` (a :class:`lossscale.TrainOneStepWithLossScaleCell`) holds a loss-scale
    state it cannot train with: a scale that is not finite, not > 0 or outside the update cell's bounds, a
    fixed update cell whose scale was changed, counters outside their ranges. The message is the shared
    argument check's (the Parameter, its value, the allowed range) and what to do. One host sync."""
    _check_train_cell(cell)
    scale = cell.get_loss_scale()
    try:
        positive_scale("scale_sense", scale)
    except ValueError:
        raise ValueError(
            f"'scale_sense' holds {scale!r}: a loss scale must be finite and > 0 (MindSpore's own cell "
            f"writes inf once its scale grows past 2**127). Set a valid scale with set_sense_scale() "
            f"or load_state_dict() before training."
        ) from None
    try:
        _check_rule_state(cell, scale)
    except ValueError as error:
        raise ValueError(f"{error} {_FOREIGN_STATE}") from None


def _check_rule_state(cell, scale):
    """The update cell's state and the train cell's counters within their ranges (shared checks)."""
    # The scale this cell trains with (an update cell reads the scale of the last train cell it was bound to).
    check = getattr(cell.loss_scaling_manager, "check_loaded_state", None)  # lossscale's update cells
    if check is not None:
        check(scale, "scale_sense")
    for name, count in cell.overflow_counters().items():
        check_int_in_range(f"loss_scale_{name}", count, low=0, high=INT32_MAX)
    window = _accumulation_of(cell)
    if window is not None:
        check_int_in_range(MICRO_STEP, _count(window.micro_step), low=0, high=window.steps - 1)


class CheckpointReceiver(nn.Cell):
    """Parameters under the names a checkpoint of another configuration holds, so that ``load_param_into_net``
    into the train cell ends as :func:`restore_loss_scale` does, checked before the next step
    (:func:`take_received_state`):

    - without accumulation, ``loss_scale_micro_step`` (0): a checkpoint saved inside an accumulation window
      sets it, and is refused (its micro-batches would be lost);
    - with lossscale's dynamic update cell, the step counters of MindSpore's own (``current_iterator_step``
      1 and ``last_overflow_iterator_step`` 0, a fresh cell's): a checkpoint of MindSpore's train cell sets
      them, and they become the clean-step count (else growth would come up to a window late).

    Args:
        accumulates (bool): the train cell has an accumulation window (its own ``loss_scale_micro_step``).
        update_cell: the train cell's update cell.
    """

    def __init__(self, accumulates, update_cell):
        super().__init__(auto_prefix=False)
        self.micro_step = None if accumulates else counter(MICRO_STEP)
        self.current_step = self.last_overflow_step = None
        if _counts_clean_steps(update_cell):
            self.current_step, self.last_overflow_step = (
                counter(name, fresh) for name, fresh in zip(MINDSPORE_COUNTERS, FRESH_MINDSPORE_COUNTERS)
            )

    def received(self):
        """``{name: Parameter}`` of the received names."""
        return {parameter.name: parameter for parameter in self.get_parameters()}


def take_received_state(cell):
    """Treat what ``cell``'s :class:`CheckpointReceiver` received as :func:`restore_loss_scale` treats a checkpoint:
    refuse a mid-window micro-batch count (nothing changes), turn MindSpore's step counters into the clean-step
    count (checked; nothing changes on error) and put the counters back to a fresh cell's. One host sync."""
    received = cell.checkpoint_receiver.received()
    _refuse_lost_window(cell, received)
    translated = _from_mindspore_counters(cell, received)
    if not translated:
        return
    good_steps = _good_steps_parameter(cell.loss_scaling_manager)
    saved = good_steps.asnumpy().copy()
    write_parameter(good_steps, translated[good_steps.name].asnumpy())
    try:
        check_cell_state(cell)
    except ValueError:
        write_parameter(good_steps, saved)
        raise
    for name, fresh in zip(MINDSPORE_COUNTERS, FRESH_MINDSPORE_COUNTERS):
        write_parameter(received[name], np.array(fresh, np.int32))


def restore_loss_scale(cell, param_dict):
    """Load the loss-scale state of a checkpoint into ``cell``; return the names loaded.

    For checkpoints loaded the usual MindSpore way, into the bare network (``load_param_into_net(net,
    ckpt)`` before the train cell exists), which ignores the loss-scale state and would restart the
    scale at its initial value. ``param_dict`` is what ``mindspore.load_checkpoint`` returns; a checkpoint
    of MindSpore's own train cell works too (its update cell's step counters become our clean-step count).
    Validated (:func:`check_cell_state`): on error nothing changes. Raises ``ValueError`` if the checkpoint
    holds no loss-scale state.

    Example:
        >>> import numpy as np
        >>> import mindspore as ms
        >>> from mindspore import nn
        >>> from lossscale import DynamicLossScaleManager, TrainOneStepWithLossScaleCell
        >>> def step(net):
        ...     update = DynamicLossScaleManager(init_loss_scale=2**10).get_update_cell()
        ...     return TrainOneStepWithLossScaleCell(net, nn.SGD(net.trainable_params(), 0.1), update)
        >>> trained = step(nn.WithLossCell(nn.Dense(2, 1), nn.MSELoss()))
        >>> trained.set_sense_scale(Tensor(np.float32(2.0**14)))
        >>> checkpoint = {p.name: p for p in trained.get_parameters()}      # as load_checkpoint returns
        >>> network = nn.WithLossCell(nn.Dense(2, 1), nn.MSELoss())
        >>> _ = ms.load_param_into_net(network, checkpoint)                # the weights, the usual way
        >>> resumed = step(network)
        >>> "scale_sense" in restore_loss_scale(resumed, checkpoint), resumed.get_loss_scale()
        (True, 16384.0)
    """
    _check_restore_arguments(cell, param_dict)
    received = cell.checkpoint_receiver.received()
    own = {
        name: parameter
        for name, parameter in loss_scale_parameters(cell).items()
        if received.get(name) is not parameter
    }
    wanted = {name: value for name, value in param_dict.items() if name in own}
    wanted.update(_from_mindspore_counters(cell, param_dict))
    if not wanted:
        raise ValueError(
            f"the checkpoint holds none of this train cell's loss-scale state ({', '.join(sorted(own))}): "
            f"it was saved from the bare network or by a cell without loss scaling."
        )
    _refuse_lost_window(cell, param_dict)
    loaded = {name: _checkpoint_array(name, value, own[name]) for name, value in wanted.items()}
    saved = {name: own[name].asnumpy().copy() for name in loaded}  # asnumpy() may share the device buffer
    _write(own, loaded)
    try:
        check_cell_state(cell)
    except ValueError:
        _write(own, saved)
        raise
    cell.state_checked()
    return sorted(wanted)


def _accumulation_of(cell):
    """The train cell's accumulation part, or None: as built, whatever a subclass assigned to ``cell.accumulation``
    for its own construct (model-zoo accumulation cells keep a bool flag there)."""
    return cell._accumulation


def _check_train_cell(cell):
    """TypeError unless ``cell`` is a lossscale train cell, told by the :class:`CheckpointReceiver` every one holds."""
    if not isinstance(getattr(cell, "checkpoint_receiver", None), CheckpointReceiver):
        raise TypeError(
            f"'cell' must be a lossscale.TrainOneStepWithLossScaleCell, but got {type(cell).__name__}: "
            f"{_what_loads_instead(cell)}"
        )


def _what_loads_instead(cell):
    """How the state of something that is not a train cell loads (a front-end, or a bare network)."""
    if is_loss_scale_optimizer(cell):
        return (
            "a LossScaleOptimizer's scale is one of its Parameters: mindspore.load_param_into_net(optimizer, "
            "checkpoint) loads it."
        )
    if type(cell).__module__.startswith("lossscale.") and callable(getattr(cell, "load_state_dict", None)):
        return f"a {type(cell).__name__}'s state loads with its load_state_dict(state_dict)."
    return "a bare network's weights load with mindspore.load_param_into_net."


def _check_restore_arguments(cell, param_dict):
    """TypeError unless ``cell`` is a lossscale train cell and ``param_dict`` a dict."""
    _check_train_cell(cell)
    if not isinstance(param_dict, dict):
        raise TypeError(
            f"'param_dict' must be a dict of Parameter names to values (what mindspore.load_checkpoint "
            f"returns), but got {type(param_dict).__name__}."
        )


def _checkpoint_array(name, value, parameter):
    """A checkpoint entry as an array of ``parameter``'s shape, numeric, and whole numbers for an integer Parameter;
    else ``TypeError``/``ValueError`` (nothing written yet: a later failure would leave a partial load)."""
    array = host_array(value)
    if not (np.issubdtype(array.dtype, np.number) or array.dtype == np.bool_):
        raise TypeError(
            f"the checkpoint's {name!r} must hold numbers, but got {value!r} of type {type(value).__name__}."
        )
    if array.shape != tuple(parameter.shape):
        raise ValueError(
            f"the checkpoint's {name!r} has shape {array.shape}, but this train cell's has shape "
            f"{tuple(parameter.shape)}: it was saved by another configuration."
        )
    wanted = mstype.dtype_to_nptype(parameter.dtype)
    if np.issubdtype(wanted, np.integer):
        low, high = np.iinfo(wanted).min, np.iinfo(wanted).max
        with np.errstate(invalid="ignore"):
            whole = np.array_equal(array, np.trunc(array)) and bool(np.all((array >= low) & (array <= high)))
        if not whole:  # a cast would truncate or wrap around, and the wrapped value could pass the range checks
            raise ValueError(
                f"the checkpoint's {name!r} must hold whole numbers in [{low}, {high}] (the Parameter "
                f"is {parameter.dtype}), but got {array.tolist()!r}."
            )
    return array


def _write(own, arrays):
    """Write each array into the Parameter of its name, by exact name. (MindSpore's ``load_param_into_net`` would
    also match names by suffix for the Parameters a partial dict lacks, and load ``loss_scale_accumulator.w``
    into the weight ``w``.)"""
    for name, array in arrays.items():
        write_parameter(own[name], array)


def _refuse_lost_window(cell, param_dict):
    """A checkpoint saved inside an accumulation window resumes only into a cell that accumulates, with the
    window's partial sums: else its micro-batches would be dropped without a word."""
    micro_step = param_dict.get(MICRO_STEP)
    done = 0 if micro_step is None else _count(micro_step)
    if done == 0:
        return
    where = f"the checkpoint was saved inside an accumulation window ({MICRO_STEP}={done})"
    window = _accumulation_of(cell)
    if window is None:
        raise ValueError(
            f"{where}, but this train cell has no accumulation (accumulation_steps=1): the window's "
            f"{done} micro-batch(es) would be lost. Resume with the accumulation_steps it was saved "
            f"with, or from a checkpoint saved at a window boundary."
        )
    missing = [p.name for p in window.accumulators if p.name not in param_dict]
    if missing:
        raise ValueError(
            f"{where} without its partial sums ({', '.join(missing)}): the window's mean would miss "
            f"{done} micro-batch(es). Save mid-window checkpoints with the accumulators (the train "
            f"cell's checkpoint_choice() keeps them), or resume from a window boundary."
        )


def _from_mindspore_counters(cell, param_dict):
    """Our update cell's clean-step count from a checkpoint of MindSpore's own dynamic update cell, which holds
    ``current_iterator_step`` (the steps, from 1) and ``last_overflow_iterator_step`` (the step of the last
    backoff or growth) instead: ``{"loss_scale_good_steps": current - last - 1}`` when the checkpoint has those
    and not ours and ``cell`` has our dynamic update cell, else ``{}``. Checked like any loaded state."""
    update_cell = cell.loss_scaling_manager
    if not _counts_clean_steps(update_cell):
        return {}
    good_steps = _good_steps_parameter(update_cell)
    if good_steps.name in param_dict or not all(name in param_dict for name in MINDSPORE_COUNTERS):
        return {}
    counters = tuple(_count(param_dict[name]) for name in MINDSPORE_COUNTERS)
    if counters == FRESH_MINDSPORE_COUNTERS:  # a fresh cell's, or this library's CheckpointReceiver: nothing to say
        return {}
    count = mindspore_good_steps(*(param_dict[name] for name in MINDSPORE_COUNTERS))
    return {good_steps.name: Tensor(np.full(good_steps.shape, count, np.int32))}


def _good_steps_parameter(update_cell):
    """The Parameter of an update cell's ``good_steps`` counter (:func:`_counts_clean_steps`)."""
    return update_cell.counters[state_names(update_cell.rule).index("good_steps") - 1]


def checkpoint_choice(cell):
    """A ``choice_func`` for ``mindspore.save_checkpoint`` that leaves the accumulators out when they are empty.

    The float32 accumulators of ``accumulation_steps > 1`` are zero at a window boundary, where a
    checkpoint does not need them (a cell built fresh has them zero). Mid-window they hold the partial
    sums and are kept, so that resuming there is exact. The window position is read when a save asks about
    an accumulator (a host sync each), so one function serves every later save. Without accumulation it
    keeps everything.
    """
    _check_train_cell(cell)
    window = _accumulation_of(cell)

    def choose(name):
        return window is None or not name.startswith(ACCUMULATOR_PREFIX) or _count(window.micro_step) != 0

    return choose
