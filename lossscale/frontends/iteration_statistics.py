"""The gradient statistics of one GradScaler iteration, for a rule that reads some (docs/design.md, section 6).

Each ``unscale_()``, and each ``step()`` that unscales its gradients itself, adds what the rule measures of the
gradients it unscaled (``LossScaler.statistics``), so every gradient of the iteration counts once; ``update()``
hands the sums to the rule and starts again from zero. For a rule that reads none, nothing is held or computed.

Example:
    >>> IterationStatistics("doc_statistics", 0).sums is None, IterationStatistics("doc_counts", 2).sums.shape
    (True, (2,))
"""

import numpy as np
from mindspore import Parameter, Tensor, nn, ops


class IterationStatistics(nn.Cell):
    """The sums of one scaler's iteration.

    Args:
        name (str): the Parameter's name prefix (the scaler's).
        count (int): how many statistics the rule reads (``len(rule.statistics)``); 0 holds nothing.
    """

    def __init__(self, name, count):
        super().__init__(auto_prefix=False)
        self.count = count
        zeros = np.zeros(count, np.float32)
        self.sums = Parameter(Tensor(zeros), name=f"{name}.statistics", requires_grad=False) if count else None
        self._zeros = Tensor(zeros) if count else None

    def add(self, values, counts):
        """Graph: the sums plus ``values`` (a tuple of float32 scalars) where ``counts`` (a bool scalar) holds;
        returns ``counts``. Nothing for a rule that reads no statistics."""
        if not self.count:
            return counts
        added = ops.select(counts, ops.stack(values), self._zeros)
        return ops.depend(counts, ops.assign_add(self.sums, added))

    def taken(self):
        """Graph: the sums as a tuple of scalars (``()`` for a rule that reads none), then zero for the next
        iteration."""
        if not self.count:
            return ()
        values = ops.unstack(self.sums.value())
        return tuple(ops.depend(value, ops.assign(self.sums, self._zeros)) for value in values)
