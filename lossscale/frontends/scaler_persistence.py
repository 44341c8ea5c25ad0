"""How a ``GradScaler`` saves and restores itself: ``state_dict()`` in its framework's keys,
``load_state_dict()`` of either framework's, and pickling between iterations. A mixin of
:class:`lossscale.frontends.grad_scaler.GradScaler`, which provides ``SPELLING``, ``_core``, ``_policy``,
``_config``, ``_states``, ``_enabled`` and ``_host_only``.

Example:
    >>> from lossscale.torch import GradScaler
    >>> saved = GradScaler(init_scale=256.0).state_dict()
    >>> restored = GradScaler()
    >>> restored.load_state_dict(saved)
    >>> restored.get_scale(), restored.get_state().good_steps
    (256.0, 0)
"""

from collections.abc import Mapping

from lossscale.core._naming import free_name
from lossscale.core.policy import LossScaleState
from lossscale.frontends.rules import parse_state, state_dict_of


class ScalerPersistence:
    """``get_state``, ``state_dict``, ``load_state_dict`` and pickling of a GradScaler."""

    def get_state(self):
        """The rule's state, read from the device: a :class:`lossscale.core.policy.LossScaleState`, or for
        MindFormers' adaptive window an :class:`lossscale.core.adaptive.AdaptiveState`."""
        self._host_only("get_state()")
        if not self._enabled:
            return LossScaleState(scale=1.0)
        return self._core.update_cell.get_state()

    def state_dict(self):
        """The state in this scaler's framework's format, empty when disabled (one host sync): Paddle's ``scale`` (a
        float32 array of shape (1,)), the rule, ``incr_count``, ``decr_count``, ``use_dynamic_loss_scaling``;
        PyTorch's ``scale``, ``growth_factor``, ``backoff_factor``, ``growth_interval``, ``_growth_tracker``.

        A rule whose hysteresis works unlike the framework's (a ``policy`` such as Megatron's) adds its keys
        (:mod:`lossscale.frontends.rules`), so that a round trip keeps them, and MindFormers' adaptive window adds
        its window state (:mod:`lossscale.frontends.adaptive_rules`); the frameworks' own ``load_state_dict``
        ignore keys they do not know."""
        self._host_only("state_dict()")
        if not self._enabled:
            return {}
        return state_dict_of(self.SPELLING, self.get_state(), self._policy, self._core.dynamic)

    def load_state_dict(self, state_dict):
        """Restore a state: this scaler's, Paddle's or PyTorch's format (validated; nothing changes on error).

        Ignored when disabled (as Paddle and PyTorch). The saved scale also becomes the
        initial scale (as both do). A TorchGradScaler refuses a fixed Paddle state
        (``use_dynamic_loss_scaling`` False): PyTorch's scale is always dynamic.
        """
        self._host_only("load_state_dict()")
        if not self._enabled:
            return
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"'state_dict' must be a dict, but got {type(state_dict).__name__}.")
        if not state_dict:
            raise RuntimeError(self.SPELLING.empty_state)
        policy, state, dynamic = parse_state(state_dict, self._policy)
        self._refuse_fixed_state(dynamic)
        self._core.set_rule(policy, state, dynamic)
        self._policy = policy

    def _refuse_fixed_state(self, dynamic):
        """Paddle's scale may be fixed (``use_dynamic_loss_scaling=False``); PyTorch's may not (TorchGradScaler)."""

    def __getstate__(self):
        """Pickle between iterations only (as PyTorch): the configuration and the state. An explicit ``name``
        comes back as given if no living scaler holds it (e.g. in a new process), else as ``name_1``, ..."""
        if self._enabled and not self._states.between_iterations():
            raise RuntimeError(
                "A GradScaler can only be pickled at the beginning of an iteration, or at the end after update()."
            )
        return {"config": self._config, "policy": self._policy, "state": self.state_dict()}

    def __setstate__(self, saved):
        config = dict(saved["config"])
        if config.get("name") is not None:
            config["name"] = free_name(config["name"])
        self.__init__(**config)
        if saved["state"]:
            self.load_state_dict(saved["state"])
