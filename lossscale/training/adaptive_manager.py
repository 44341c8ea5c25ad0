"""``AdaptiveLossScaleManager``: MindFormers' adaptive-window rule behind MindSpore's manager API.

It is a :class:`lossscale.training.managers.DynamicLossScaleManager` whose rule is an
:class:`lossscale.core.adaptive.AdaptiveWindowRule` and whose update cells are
:class:`lossscale.AdaptiveLossScaleUpdateCell`: ``Model``, ``build_train_network`` and MindSpore's own ``Model``
take it as they take the dynamic manager, and ``get_loss_scale()`` reads the device once a train cell runs.

Example:
    >>> manager = AdaptiveLossScaleManager(init_loss_scale=2**10, scale_window=20)
    >>> for _ in range(20):
    ...     manager.update_loss_scale(False)
    >>> manager.get_loss_scale(), manager.state_dict()["window_up_count"]
    (2048.0, 1)
"""

from lossscale.core.adaptive import MAX_SCALE_WINDOW, MIN_SCALE_WINDOW, update_adaptive
from lossscale.core.adaptive_cell import (
    AdaptiveLossScaleUpdateCell,
    adaptive_rule,
    adaptive_state_dict,
    adaptive_state_from_dict,
)
from lossscale.training.managers import DynamicLossScaleManager


class AdaptiveLossScaleManager(DynamicLossScaleManager):
    """Dynamic loss scaling whose growth window adapts (MindFormers' ``AdaptiveLossScaleUpdateCell``).

    Args:
        init_loss_scale (float): initial scale, finite and >= 1. Default 2**24 (MindSpore's managers').
        scale_factor (float): growth and back-off factor (> 1). Default 2.
        scale_window (int): the starting window, one of the levels. Default 20, the lowest level of the default
            bounds (training starts growing fast; the window rises as the scale settles).
        max_scale_window (int): the top level. Default 1000.
        min_scale_window (int): the lowest level. Default 20.

    The window levels, the moves and the state are those of :mod:`lossscale.core.adaptive`; ``state_dict()``
    has the keys of :meth:`lossscale.AdaptiveLossScaleUpdateCell.state_dict`.

    Example:
        >>> manager = AdaptiveLossScaleManager(init_loss_scale=2**12, scale_window=20)
        >>> type(manager.get_update_cell()).__name__, manager.rule.levels[:3]
        ('AdaptiveLossScaleUpdateCell', (20, 30, 40))
    """

    def __init__(
        self,
        init_loss_scale=2**24,
        scale_factor=2,
        scale_window=MIN_SCALE_WINDOW,
        max_scale_window=MAX_SCALE_WINDOW,
        min_scale_window=MIN_SCALE_WINDOW,
    ):
        super().__init__()
        self.policy = adaptive_rule(
            init_loss_scale, scale_factor, scale_window, max_scale_window, min_scale_window, "init_loss_scale"
        )
        self._scale_factor, self._scale_window = scale_factor, scale_window
        self._state = self.policy.initial_state()

    @property
    def rule(self):
        """The :class:`lossscale.core.adaptive.AdaptiveWindowRule` (the manager's ``policy``)."""
        return self.policy

    @classmethod
    def from_policy(cls, policy):
        """A manager applying ``policy`` (an :class:`lossscale.core.adaptive.AdaptiveWindowRule`)."""
        return cls(
            policy.init_scale,
            policy.scale_factor,
            policy.scale_window,
            policy.max_scale_window,
            policy.min_scale_window,
        )

    @property
    def increase_ratio(self):
        """MindSpore's name for the growth factor."""
        return self.rule.scale_factor

    @property
    def decrease_ratio(self):
        """MindSpore's name for the back-off factor: ``1 / scale_factor`` in float32, as the rule backs off."""
        return self.rule.backoff_factor

    def _host_update(self, overflow):
        return update_adaptive(self.rule, self._state, overflow)

    def _new_cell(self, state):
        cell = AdaptiveLossScaleUpdateCell.from_rule(self.rule)
        cell.set_state(state)
        return cell

    def state_dict(self):
        """``{'loss_scale', 'scale_window', 'list_index', ...}`` (device values when in use)."""
        return adaptive_state_dict(self.get_state())

    def _state_from_dict(self, state):
        return adaptive_state_from_dict(self.rule, state)
