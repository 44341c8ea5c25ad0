"""The train cell's arguments checked when it is built (the framework-free checks are in ``core._validation``).

Example:
    >>> fixed_scale_of(Tensor(1024.0)), fixed_scale_of(nn.Dense(1, 1))
    (1024.0, None)
"""

import numbers

import numpy as np
from mindspore import Parameter, Tensor, get_context, nn, ops

from lossscale.core._optimizers import is_loss_scale_optimizer, is_parameter_optimizer
from lossscale.core.rule import LossScaleRule
from lossscale.core.scaler import rule_scale


def check_train_arguments(network, optimizer, scale_sense):
    """TypeError for a ``network``, ``optimizer`` or ``scale_sense`` of the wrong kind."""
    if not isinstance(network, nn.Cell):
        raise TypeError(
            f"'network' must be a mindspore.nn.Cell (the network with its loss, one output), but got "
            f"{type(network).__name__}."
        )
    if is_loss_scale_optimizer(optimizer):
        raise TypeError(
            "'optimizer' is a LossScaleOptimizer, which scales in your own training step; this cell scales "
            "itself: give it the inner optimizer (opt.inner_optimizer) and an update cell with the rule "
            "(e.g. DynamicLossScaleUpdateCell.from_policy(get_preset('tf_keras')))."
        )
    if not (isinstance(optimizer, nn.Optimizer) or is_parameter_optimizer(optimizer)):
        raise TypeError(
            f"'optimizer' must be a mindspore.nn.Optimizer, or an optimizer Cell holding its Parameters in "
            f"'parameters' (mindspore.experimental.optim, mint.optim), but got {type(optimizer).__name__}."
        )
    if not isinstance(scale_sense, (nn.Cell, Tensor)):
        raise TypeError(
            f"'scale_sense' must be an update Cell or a Tensor, but got {type(scale_sense).__name__}."
            f"{_scale_sense_hint(scale_sense)}"
        )
    rule_scale(scale_sense, "scale_sense")
    refuse_sparse_gradients_on_cpu(network)


def _scale_sense_hint(scale_sense):
    """What to give instead of ``scale_sense`` when it is a manager, a number or a rule (the usual mix-ups)."""
    if callable(getattr(scale_sense, "get_update_cell", None)):
        return (
            " Give the manager's update cell: manager.get_update_cell() (Model(loss_scale_manager=...) takes managers)."
        )
    if isinstance(scale_sense, numbers.Real) and not isinstance(scale_sense, bool):
        return (
            f" For a fixed scale give FixedLossScaleUpdateCell({scale_sense!r}) or Tensor({scale_sense!r}, "
            f"mindspore.float32)."
        )
    if isinstance(scale_sense, LossScaleRule):
        return " For a rule give DynamicLossScaleUpdateCell.from_policy(policy) (any rule: LossScaleUpdateCell(rule))."
    return ""


def refuse_nn_optimizer_options(optimizer, options):
    """ValueError for the ``options`` (name -> value) that are on but need an ``nn.Optimizer``'s ``get_lr()`` and
    ``global_step``, which the PyTorch-style optimizers of ``mindspore.experimental.optim`` do not have."""
    wanted = [name for name, value in options.items() if value]
    if wanted and not isinstance(optimizer, nn.Optimizer):
        verb = "needs" if len(wanted) == 1 else "need"
        raise ValueError(
            f"{', '.join(repr(name) for name in wanted)} {verb} a mindspore.nn.Optimizer (its get_lr() "
            f"and global_step), but the optimizer is "
            f"{type(optimizer).__module__}.{type(optimizer).__name__}, whose learning-rate schedulers are "
            f"stepped from Python. Leave them False with it."
        )


def refuse_applied_overflows_with_a_dynamic_rule(drop_overflow_update, core):
    """ValueError for ``drop_overflow_update=False`` (apply every step) with a dynamic rule (the ``core``'s): its
    overflowing steps would be applied (the weights become inf or nan) while the rule backs off for them, a
    combination of no use. A fixed scale applied every step is MindSpore's ``FixedLossScaleManager(S, False)``."""
    if drop_overflow_update or not core.dynamic:
        return
    raise ValueError(
        f"'drop_overflow_update' is False (apply every step, overflowing ones too), but the update cell "
        f"({type(core.update_cell).__name__}) is dynamic: its overflowing steps would be applied, making the "
        f"weights inf or nan, while its rule backs off for them. Keep drop_overflow_update=True with a dynamic "
        f"rule; to apply every step, use a fixed scale (FixedLossScaleManager(S, drop_overflow_update=False))."
    )


def fixed_scale_of(scale_sense):
    """The scale if ``scale_sense`` never changes it (a Tensor or a fixed update cell), else None."""
    if isinstance(scale_sense, Tensor):
        array = scale_sense.asnumpy()
        return float(np.float32(array.reshape(-1)[0])) if array.size == 1 and array.dtype != np.bool_ else None
    fixed_rule = getattr(scale_sense, "rule", None) is not None and not scale_sense.rule.dynamic
    if isinstance(scale_sense, nn.FixedLossScaleUpdateCell) or fixed_rule:
        return float(np.float32(scale_sense.get_loss_scale()))
    return None


@ops.constexpr
def _refuse_several_outputs(kind):
    raise TypeError(
        f"the network returned a {kind}: a train cell needs the network with its loss to return one "
        f"Tensor, the loss (wrap it, e.g. nn.WithLossCell, or return only the loss)."
    )


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
            f"whose gradients are dense, or train this network without loss scaling."
        )
