"""A loss-scale rule written outside the library, as a user writes one (docs/design.md shows the same rule): halve
on an overflow, quarter on the second overflow in a row, double after ``window`` clean steps, never above
``ceiling``. It touches no lossscale module."""

import dataclasses

from lossscale.core.rule import LossScaleRule, StateField, minimum, where


@dataclasses.dataclass(frozen=True)
class QuarterOnRepeat(LossScaleRule):
    init_scale: float = 2.0**16
    window: int = 500
    ceiling: float = 2.0**20

    fields = (StateField("clean_steps"), StateField("overflows_in_a_row"))

    def settings(self):
        return {"window": self.window, "ceiling": self.ceiling}

    def update(self, overflow, statistics, scale, clean_steps, in_a_row, window, ceiling):
        in_a_row = where(overflow, in_a_row + 1, 0)
        backed_off = where(in_a_row >= 2, scale * 0.25, scale * 0.5)
        clean_steps = where(overflow, 0, clean_steps + 1)
        grow = clean_steps >= window
        grown = where(grow, minimum(scale * 2.0, ceiling), scale)
        return where(overflow, backed_off, grown), where(grow, 0, clean_steps), in_a_row

    def scale_bounds(self):
        return 0.0, self.ceiling


def transcribed(rule, flags):
    """The rule in plain Python, written from its description: the scale after each step."""
    scale, clean, in_a_row, scales = rule.init_scale, 0, 0, []
    for overflow in flags:
        if overflow:
            in_a_row, clean = in_a_row + 1, 0
            scale *= 0.25 if in_a_row >= 2 else 0.5
        else:
            in_a_row, clean = 0, clean + 1
            if clean >= rule.window:
                scale, clean = min(scale * 2.0, rule.ceiling), 0
        scales.append(scale)
    return scales
