"""Argument checks of the train cell that need MindSpore (the framework-free ones are in ``_validation``)."""
import contextlib
import itertools
import numbers

import numpy as np
from mindspore import Parameter, Tensor, get_context, nn, ops


def check_train_arguments(network, optimizer, scale_sense):
    """TypeError for a ``network``, ``optimizer`` or ``scale_sense`` of the wrong kind."""
    if not isinstance(network, nn.Cell):
        raise TypeError(f"'network' must be a mindspore.nn.Cell (the network with its loss, one output), but got "
                        f"{type(network).__name__}.")
    from lossscale.loss_scale_optimizer import LossScaleOptimizer  # pylint: disable=import-outside-toplevel

    if isinstance(optimizer, LossScaleOptimizer):
        raise TypeError("'optimizer' is a LossScaleOptimizer, which scales in your own training step; this cell scales "
                        "itself: give it the inner optimizer (opt.inner_optimizer) and an update cell with the rule "
                        "(e.g. DynamicLossScaleUpdateCell.from_policy(get_preset('tf_keras'))).")
    if not (isinstance(optimizer, nn.Optimizer) or is_parameter_optimizer(optimizer)):
        raise TypeError(f"'optimizer' must be a mindspore.nn.Optimizer, or an optimizer Cell holding its Parameters in "
                        f"'parameters' (mindspore.experimental.optim, mint.optim), but got {type(optimizer).__name__}.")
    if not isinstance(scale_sense, (nn.Cell, Tensor)):
        raise TypeError(f"'scale_sense' must be an update Cell or a Tensor, but got {type(scale_sense).__name__}."
                        f"{_scale_sense_hint(scale_sense)}")
    from lossscale.scaler import rule_scale  # pylint: disable=import-outside-toplevel

    rule_scale(scale_sense, "scale_sense")
    refuse_sparse_gradients_on_cpu(network)


def _scale_sense_hint(scale_sense):
    """What to give instead of ``scale_sense`` when it is a manager, a number or a rule (the usual mix-ups)."""
    from lossscale.policy import LossScalePolicy  # pylint: disable=import-outside-toplevel

    if callable(getattr(scale_sense, "get_update_cell", None)):
        return (" Give the manager's update cell: manager.get_update_cell() (Model(loss_scale_manager=...) takes "
                "managers).")
    if isinstance(scale_sense, numbers.Real) and not isinstance(scale_sense, bool):
        return (f" For a fixed scale give FixedLossScaleUpdateCell({scale_sense!r}) or Tensor({scale_sense!r}, "
                f"mindspore.float32).")
    if isinstance(scale_sense, LossScalePolicy):
        return " For a rule give DynamicLossScaleUpdateCell.from_policy(policy)."
    return ""


def is_parameter_optimizer(optimizer):
    """Whether ``optimizer`` is a Cell holding its Parameters in ``parameters``, as MindSpore's train cells need
    (``mindspore.experimental.optim`` and ``mint.optim`` optimizers, which are not ``nn.Optimizer``s)."""
    parameters = getattr(optimizer, "parameters", None)
    return (isinstance(optimizer, nn.Cell) and isinstance(parameters, (tuple, list))
            and all(isinstance(parameter, Parameter) for parameter in parameters))


def refuse_nn_optimizer_options(optimizer, options):
    """ValueError for the ``options`` (name -> value) that are on but need an ``nn.Optimizer``'s ``get_lr()`` and
    ``global_step``, which the PyTorch-style optimizers of ``mindspore.experimental.optim`` do not have."""
    wanted = [name for name, value in options.items() if value]
    if wanted and not isinstance(optimizer, nn.Optimizer):
        verb = "needs" if len(wanted) == 1 else "need"
        raise ValueError(f"{', '.join(repr(name) for name in wanted)} {verb} a mindspore.nn.Optimizer (its get_lr() "
                         f"and global_step), but the optimizer is "
                         f"{type(optimizer).__module__}.{type(optimizer).__name__}, whose learning-rate schedulers are "
                         f"stepped from Python. Leave them False with it.")


def fixed_scale_of(scale_sense):
    """The scale if ``scale_sense`` never changes it (a Tensor or a fixed update cell), else None."""
    from lossscale.update_cells import FixedLossScaleUpdateCell  # pylint: disable=import-outside-toplevel

    if isinstance(scale_sense, Tensor):
        array = scale_sense.asnumpy()
        return float(np.float32(array.reshape(-1)[0])) if array.size == 1 and array.dtype != np.bool_ else None
    if isinstance(scale_sense, (FixedLossScaleUpdateCell, nn.FixedLossScaleUpdateCell)):
        return float(np.float32(scale_sense.get_loss_scale()))
    return None


@ops.constexpr
def _refuse_several_outputs(kind):
    raise TypeError(f"the network returned a {kind}: a train cell needs the network with its loss to return one "
                    f"Tensor, the loss (wrap it, e.g. nn.WithLossCell, or return only the loss).")


def check_loss_output(loss):
    """Graph (compile time): the network's output must be one Tensor."""
    if isinstance(loss, tuple):
        _refuse_several_outputs("tuple")
    if isinstance(loss, list):
        _refuse_several_outputs("list")
    return loss


def _sparse_lookup(cell):
    """Whether ``cell`` is an embedding lookup with sparse gradients, told by what it holds (an ``embedding_table``
    and ``sparse=True``), not by its class: MindSpore's amp O1 rewrite turns ``nn.EmbeddingLookup`` into generated
    classes that, from the second network built in a process on, are no longer its subclasses."""
    return getattr(cell, "sparse", False) is True and isinstance(getattr(cell, "embedding_table", None), Parameter)


def refuse_sparse_gradients_on_cpu(network):
    """Raise ``ValueError`` if ``network`` has cells that produce sparse gradients and the target is CPU.

    ``nn.EmbeddingLookup(sparse=True)`` (the only choice with ``target="CPU"``) makes RowTensor
    gradients. On MindSpore 2.10's CPU backend a graph that applies them under the overflow
    condition next to the loss-scale state updates ends in a segmentation fault (reproduced here
    with ``LazyAdam``, with a dynamic update cell or a fixed Tensor scale), so it is refused
    with an error instead of killing the process.
    """
    if get_context("device_target") != "CPU":
        return
    sparse = [name or type(network).__name__ for name, cell in network.cells_and_names() if _sparse_lookup(cell)]
    if sparse:
        raise ValueError(
            f"'network' has cells with sparse (RowTensor) gradients: {', '.join(sparse)} "
            f"(nn.EmbeddingLookup with sparse=True). On CPU, MindSpore 2.10 crashes with a segmentation fault "
            f"when such gradients are applied in a graph that also updates the loss-scale state. Use nn.Embedding, "
            f"whose gradients are dense, or train this network without loss scaling.")


_HOST_CALLS = set()  # tokens of the train cells whose __call__ is running (compiling or stepping)
_TOKENS = itertools.count()


def host_call_token():
    """A token naming one train cell for :func:`host_call` and :func:`refuse_without_host_call`."""
    return next(_TOKENS)


@contextlib.contextmanager
def host_call(token):
    """The train cell's ``__call__`` is running: its graph may be compiled with host-side features."""
    _HOST_CALLS.add(token)
    try:
        yield
    finally:
        _HOST_CALLS.discard(token)


_TRACED_OWN_CONSTRUCT = set()  # tokens of the train cells whose own construct was traced (see below)


@ops.constexpr
def mark_own_construct_traced(token):
    """Graph (compile time): the train cell ``token``'s own ``construct`` was traced, so the options only it
    honours take effect (:func:`refuse_options_without_construct`)."""
    _TRACED_OWN_CONSTRUCT.add(token)
    return True


def refuse_options_without_construct(cell_class, token, options):
    """Host, after compiling: ``RuntimeError`` if ``options`` (non-default options only the train cell's own
    ``construct`` honours) were given to a subclass whose ``construct`` never runs it."""
    if token in _TRACED_OWN_CONSTRUCT:
        return
    raise RuntimeError(
        f"{', '.join(options)} would have no effect: {cell_class.__name__}.construct does not run "
        f"TrainOneStepWithLossScaleCell.construct (e.g. through super().construct(*inputs)), the only place they "
        f"act. Build the cell without them, or do it in your construct (nothing ran yet).")


@ops.constexpr
def refuse_reassigned_options(names):
    """Graph (compile time): a subclass assigned these options after building and still runs the train cell's own
    ``construct``, which keeps the values the cell was built with (see ``train_cell._built_option``)."""
    option = next((name for name in names if name != "accumulation"), "accumulation_steps")
    part = " (the accumulation part is built from accumulation_steps)" if "accumulation" in names else ""
    raise RuntimeError(
        f"this cell's class assigned {', '.join(names)} after TrainOneStepWithLossScaleCell.__init__ and still runs "
        f"TrainOneStepWithLossScaleCell.construct, which keeps the values the cell was built with: give the options "
        f"to __init__ instead (super().__init__(network, optimizer, scale_sense, {option}=...)){part}, or name the "
        f"subclass's own attributes differently.")


@ops.constexpr
def refuse_without_host_call(token, features):
    """Graph (compile time): refuse to compile a train cell with host-side ``features`` (warn/raise policy,
    forensics) into another graph, where they would silently not run."""
    if token not in _HOST_CALLS:
        raise RuntimeError(
            f"this train cell checks {features} on the host after each call of the cell; compiled into another "
            f"graph (your own mindspore.jit function or Cell, or Model's dataset sink mode on GPU/Ascend) those "
            f"checks would silently not run. Call the train cell itself for each step (Model: "
            f"dataset_sink_mode=False), or build it with overflow_policy='skip' and debug_overflow=False.")
    return True
