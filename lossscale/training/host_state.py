"""The train cell's host-side API (a mixin of :class:`lossscale.TrainOneStepWithLossScaleCell`): its scale, counters
and state, checked before the first step and after a load, and the checks run after a step on the host.
"""

from mindspore import Tensor

from lossscale.core._parameters import write_parameter
from lossscale.core.scaler import positive_scale
from lossscale.training.arguments import fixed_scale_of
from lossscale.training.checkpoints import check_cell_state, checkpoint_choice, take_received_state


class HostState:
    """Methods of the train cell that run on the host (each syncs it at most once)."""

    def set_sense_scale(self, sens):
        """Set the scale (host to device, no graph rebuild), within the update cell's rule: between a dynamic
        cell's ``min_loss_scale`` and ``max_loss_scale``; refused for a fixed scale that an update cell or the
        optimizer's ``loss_scale`` fixes."""
        if not isinstance(sens, Tensor):
            raise TypeError(f"'sens' must be a Tensor, but got {type(sens).__name__}.")
        if sens.shape != self.scale_sense.shape:
            raise ValueError(f"'sens' must have shape {self.scale_sense.shape}, but got {sens.shape}.")
        value = float(positive_scale("sens", sens))
        if self._optimizer_unscales:
            raise ValueError(
                "'set_sense_scale' cannot change the scale: the optimizer was built with "
                "loss_scale equal to the fixed scale and divides by it."
            )
        cell = self.loss_scaling_manager
        if cell is not None and fixed_scale_of(cell) is not None:
            raise ValueError(
                f"'set_sense_scale' cannot change the scale of a {type(cell).__name__}, which fixes it at "
                f"{cell.get_loss_scale()!r}: build the update cell with {value!r} instead."
            )
        write_parameter(self.scale_sense, self.loss_scaler.checked_scale(sens, "sens"))

    def get_loss_scale(self):
        """The current scale held on the device, as a float (one host sync)."""
        return self.loss_scaler.get_scale()

    def overflow_counters(self):
        """In-graph counters as Python ints (one host sync): ``steps`` (optimizer steps, i.e. windows),
        ``skipped_steps``, ``consecutive_overflows``, ``last_overflow_step`` (1-based, 0 = never)."""
        return self.counters.as_dict()

    def state_dict(self):
        """The loss-scale state as Python numbers, ``{'loss_scale', 'good_steps', 'hysteresis_left'}`` (counters
        only with a dynamic update cell of lossscale's; one host sync)."""
        return self.loss_scaler.state_dict()

    def load_state_dict(self, state):
        """Restore :meth:`state_dict` output (validated against the update cell's rule; nothing changes on error).
        A fixed scale must be the one saved; a frozen scale (the optimizer divides by it) cannot change."""
        self.loss_scaler.load_state_dict(state)
        self.check_state()

    def check_state(self):
        """Raise ``ValueError`` if the loss-scale state (e.g. as a checkpoint loaded it) cannot be trained with
        (:func:`lossscale.training.checkpoints.check_cell_state`). Runs by itself before the first step; call it after
        loading a checkpoint into a cell that has already run. What a checkpoint of another configuration held
        (:class:`lossscale.training.checkpoints.CheckpointReceiver`) is refused or translated first. One host sync."""
        take_received_state(self)
        check_cell_state(self)
        self.state_checked()

    def state_checked(self):
        """Record that the state was checked (by :meth:`check_state` or a validated load)."""
        self._state_checked = True

    def checkpoint_choice(self):
        """A ``choice_func`` for ``mindspore.save_checkpoint`` that leaves out the accumulators when they are
        empty, at each save it serves (:func:`lossscale.training.checkpoints.checkpoint_choice`)."""
        return checkpoint_choice(self)

    def _after_step(self, outputs, scale_used):
        """Host check after a step (only with a warn/raise policy or debug_overflow): one sync."""
        if not bool(outputs[1].asnumpy()):
            return
        if self.forensics is not None:
            self.forensics.report(int(self.counters.last_overflow_step.asnumpy()))
        if self.persistent_overflow.active:
            rule = self.loss_scaler.rule  # None for a fixed scale or a foreign update cell
            minimum = rule.scale_bounds()[0] if rule is not None and rule.dynamic else None
            self.persistent_overflow.check(self.overflow_counters(), scale_used, minimum)
