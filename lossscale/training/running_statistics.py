"""Running statistics that a forward pass updates in place, restored when their step is skipped (design.md, 5).

Every layer holding a non-trainable ``moving_mean``, ``running_mean``, ... Parameter (BatchNorm, SyncBatchNorm,
InstanceNorm, ``mint.nn`` ones) updates it in the training forward pass, before any overflow check: a forward
overflow would leave it inf or nan for good (MindSpore and PyTorch keep them). Per call (nothing without such
layers)::

    saved = copy(statistics)                      # before the forward pass
    statistics = skipped ? saved : statistics     # after the decision: one select and assign per statistic

Example:
    >>> from mindspore import nn
    >>> [p.name for p in RunningStatistics.of(nn.SequentialCell(nn.Dense(2, 2), nn.BatchNorm1d(2))).statistics]
    ['1.moving_mean', '1.moving_variance']
"""

from mindspore import ParameterTuple, nn, ops

_copy = ops.MultitypeFuncGraph("_copy")
_restore = ops.MultitypeFuncGraph("_restore")


@_copy.register("Tensor")
def _tensor_copy(statistic):
    # A computed copy: the Parameter's loaded value itself aliases the buffer that the forward pass then updates in
    # place (measured on MindSpore 2.10 CPU: tests/training/test_running_statistics.py fails with it).
    return statistic * 1


@_restore.register("Tensor", "Tensor", "Tensor")
def _tensor_restore(skipped, statistic, saved):
    return ops.assign(statistic, ops.select(skipped, saved, statistic))


# The attribute names of the running statistics of MindSpore's (moving_*) and mint's (running_*) normalization layers.
STATISTIC_NAMES = ("moving_mean", "moving_variance", "running_mean", "running_var", "num_batches_tracked")


def _holds_statistics(cell):
    """Whether ``cell`` holds running statistics: a non-trainable Parameter under one of :data:`STATISTIC_NAMES`.
    Told by what the layer holds, not by its class: MindSpore's amp O1 rewrite turns ``nn.BatchNorm1d`` into
    generated classes that, from the second network built in a process on, are no longer ``_BatchNorm``'s."""
    return any(
        name in STATISTIC_NAMES and not parameter.requires_grad
        for name, parameter in cell.parameters_and_names(expand=False)
    )


class RunningStatistics(nn.Cell):
    """The non-trainable Parameters of a network's BatchNorm layers: ``save()`` before the forward pass,
    ``restore_if(skipped, saved)`` after the decision (graph methods, no host sync).

    Args:
        statistics (tuple[Parameter]): the Parameters to guard (see :meth:`of`).
    """

    def __init__(self, statistics):
        super().__init__(auto_prefix=False)
        self.statistics = ParameterTuple(statistics)
        self.hyper_map = ops.HyperMap()

    @classmethod
    def of(cls, network):
        """A guard of ``network``'s BatchNorm statistics, or None if it has none."""
        statistics, seen = [], set()
        for _, cell in network.cells_and_names():
            if not _holds_statistics(cell):
                continue
            for parameter in cell.get_parameters(expand=False):
                if not parameter.requires_grad and id(parameter) not in seen:
                    seen.add(id(parameter))
                    statistics.append(parameter)
        return cls(tuple(statistics)) if statistics else None

    def save(self):
        """Copies of the statistics as they are now (call before the forward pass)."""
        return self.hyper_map(_copy, self.statistics)

    def restore_if(self, skipped, saved):
        """Write ``saved`` back into the statistics where ``skipped`` (a bool scalar) is True."""
        return self.hyper_map(ops.partial(_restore, skipped), self.statistics, saved)
