"""What the train cell checks on the host, as functions of its public attributes: a scale written into it
(:func:`checked_sense_scale`) and, after a step, its persistent-overflow policy and forensics (:func:`after_step`).
"""

from mindspore import Tensor

from lossscale.core.scaler import positive_scale
from lossscale.training.arguments import fixed_scale_of


def checked_sense_scale(cell, sens):
    """``sens`` as the scale ``cell.set_sense_scale`` writes, within the update cell's rule: between a dynamic cell's
    ``min_loss_scale`` and ``max_loss_scale``; refused for a fixed scale that an update cell or the optimizer's
    ``loss_scale`` fixes."""
    if not isinstance(sens, Tensor):
        raise TypeError(f"'sens' must be a Tensor, but got {type(sens).__name__}.")
    if sens.shape != cell.scale_sense.shape:
        raise ValueError(f"'sens' must have shape {cell.scale_sense.shape}, but got {sens.shape}.")
    value = float(positive_scale("sens", sens))
    if cell.optimizer_unscales:
        raise ValueError(
            "'set_sense_scale' cannot change the scale: the optimizer was built with "
            "loss_scale equal to the fixed scale and divides by it."
        )
    update_cell = cell.loss_scaling_manager
    if update_cell is not None and fixed_scale_of(update_cell) is not None:
        raise ValueError(
            f"'set_sense_scale' cannot change the scale of a {type(update_cell).__name__}, which fixes it at "
            f"{update_cell.get_loss_scale()!r}: build the update cell with {value!r} instead."
        )
    return cell.loss_scaler.checked_scale(sens, "sens")


def after_step(cell, outputs, scale_used):
    """Host check after a step of ``cell`` (only with a warn/raise policy or debug_overflow): one sync."""
    if not bool(outputs[1].asnumpy()):
        return
    if cell.forensics is not None:
        cell.forensics.report(int(cell.counters.last_overflow_step.asnumpy()))
    if cell.persistent_overflow.active:
        rule = cell.loss_scaler.rule  # None for a fixed scale or a foreign update cell
        minimum = rule.scale_bounds()[0] if rule is not None and rule.dynamic else None
        cell.persistent_overflow.check(cell.overflow_counters(), scale_used, minimum)
