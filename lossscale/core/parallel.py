"""What runs over the ranks in MindSpore's parallel modes, decided when a cell is built (MindSpore's rule).

Under data or hybrid parallel the gradients are reduced over the ranks (:func:`gradient_reducer`), and in
every parallel mode each overflow decision is all-reduced (:class:`lossscale.core.scaler.LossScaler`).
"""

from mindspore import context, nn
from mindspore.context import ParallelMode
from mindspore.ops import constexpr
from mindspore.parallel._utils import _get_device_num, _get_gradients_mean


def parallel_mode():
    """MindSpore's current ``parallel_mode``."""
    return context.get_auto_parallel_context("parallel_mode")


def is_parallel():
    """True in every parallel mode but stand-alone (MindSpore's own train cell's rule)."""
    return parallel_mode() != ParallelMode.STAND_ALONE


@constexpr
def refuse_parallel_mode_set_after_build(built_distributed):
    """RuntimeError, while tracing, if loss scaling built in stand-alone mode is compiled in a parallel mode.

    What runs over the ranks is decided when things are built, by MindSpore's rule too: the overflow flag's
    all-reduce, the gradient reducer of a train cell (MindSpore's ``TrainOneStepCell.__init__``) and of
    ``LossScaleOptimizer.minimize``. Built before ``set_auto_parallel_context``, each rank would decide and
    (there) step on its own gradients: the ranks' weights diverge without an error (measured under msrun).
    The other way round (built parallel, compiled stand-alone) the all-reduce has no group and fails loudly.

    Example:
        >>> refuse_parallel_mode_set_after_build(False)  # stand-alone now too
        True
    """
    if not built_distributed and is_parallel():
        raise RuntimeError(
            f"lossscale's loss scaling (a train cell, GradScaler or LossScaleOptimizer) was built in "
            f"stand-alone mode but is compiled with parallel_mode={parallel_mode()!r}: each rank "
            f"would decide its overflow alone, and a train cell or LossScaleOptimizer.minimize would "
            f"not reduce the gradients either, so the ranks' weights would diverge. Build it (and "
            f"Model) after mindspore.set_auto_parallel_context(parallel_mode=...)."
        )
    return True


def gradient_reducer(parameters):
    """What reduces the gradients of ``parameters`` over the ranks, by MindSpore's own rule (its
    ``TrainOneStepCell``): a ``DistributedGradReducer`` (mean or sum as ``gradients_mean`` says) under data
    or hybrid parallel, else the identity. Graph code calls it on the gradients before unscaling them.

    Example:
        >>> type(gradient_reducer(nn.Dense(2, 1).trainable_params())).__name__  # stand-alone
        'Identity'
    """
    if parallel_mode() in (ParallelMode.DATA_PARALLEL, ParallelMode.HYBRID_PARALLEL):
        return nn.DistributedGradReducer(parameters, _get_gradients_mean(), _get_device_num())
    return nn.Identity()
