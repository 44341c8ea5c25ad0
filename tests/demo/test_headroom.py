"""The largest safe scale and the results page's section built on it: the search (a table of thresholds and
guesses), the probe on a network whose largest safe scale is known, and the section's numbers and sentences
from made-up runs (the page itself is checked against a fresh run in test_results_page.py)."""

import types

import mindspore as ms
import numpy as np
import pytest
from mindspore import Parameter, Tensor, nn, ops

from lossscale.demo.diagnostics import SafeScaleProbe, largest_safe_exponent
from lossscale.demo.headroom import agreement, automatic_section, findings, gap, headroom


@pytest.mark.parametrize("threshold", [-1, 0, 1, 7, 24, 25, 63, 64, 80])
@pytest.mark.parametrize("guess", [-5, 0, 3, 24, 64, 99])
def test_the_search_finds_the_last_finite_exponent_from_any_guess(threshold, guess):
    calls = []

    def finite_at(exponent):
        calls.append(exponent)
        return exponent <= threshold

    found = largest_safe_exponent(finite_at, guess)
    assert found == (None if threshold < 0 else min(threshold, 64))
    assert all(0 <= exponent <= 64 for exponent in calls)
    assert len(calls) <= 16


def test_from_the_right_guess_the_search_takes_two_calls():
    calls = []
    assert largest_safe_exponent(lambda e: calls.append(e) or e <= 20, 20) == 20 and calls == [20, 21]


class Product(nn.Cell):
    """``sum(w * x)`` in float16, returned in float32: the gradient of ``w`` is ``x * scale`` in float16, finite
    while the scale itself and ``x * scale`` stay below 65520."""

    def __init__(self):
        super().__init__()
        self.w = Parameter(Tensor(np.ones(4), ms.float16), name="w")

    def construct(self, x, label):
        return ops.cast((self.w * x).sum(), ms.float32) + label.sum()


def _run_context(network, step, x):
    arguments = types.SimpleNamespace(
        cur_step_num=step,
        train_network=types.SimpleNamespace(network=network),
        train_dataset_element=[Tensor(np.full(4, x), ms.float16), Tensor(np.zeros(1), ms.float32)],
    )
    return types.SimpleNamespace(original_args=lambda: arguments)


def test_the_probe_measures_every_nth_step_from_the_first_with_its_batch():
    """x = 8: 2**12 * 8 = 32768 is finite, 2**13 * 8 overflows; x = 1: the cast of 2**16 to float16 overflows;
    x = inf: nothing is finite."""
    probe, network = SafeScaleProbe(every=3), Product()
    for step, x in enumerate([8.0, 8.0, 8.0, 1.0, 1.0, 1.0, np.inf], start=1):
        probe.on_train_step_begin(_run_context(network, step, x))
    assert probe.measured == [(1, 2.0**12), (4, 2.0**15), (7, None)]


def _run(scales, overflows, measured, accuracy=0.8, skipped=None, loss=0.5):
    records = [
        {"step": step, "loss_scale": scale, "overflow": overflow}
        for step, (scale, overflow) in enumerate(zip(scales, overflows), start=1)
    ]
    summary = {"skipped_steps": sum(overflows) if skipped is None else skipped, "steps": len(scales)}
    return {
        "records": records,
        "largest_safe_scales": measured,
        "test_accuracy": accuracy,
        "final_loss": loss * 1e-4,
        "config": {"loss_weight": 1e-4},
        "summary": summary,
    }


FP32 = {"test_accuracy": 0.8, "final_loss": 0.5e-4, "config": {"loss_weight": 1e-4}}


@pytest.mark.parametrize(
    "scale, safe, expected",
    [(2.0**24, 2.0**30, 6.0), (2.0**24, 2.0**24, 0.0), (2.0**24, 2.0**23, -1.0), (1.0, None, None)],
)
def test_the_gap_is_in_powers_of_two_below_the_safe_scale(scale, safe, expected):
    assert gap(scale, safe) == expected


@pytest.mark.parametrize(
    "overflows, measured, expected",
    [
        ([False, False, True], [(1, 8.0), (3, 2.0)], (2, 2)),  # 4 <= 8 applied; 4 > 2 overflowed
        ([False, True, False], [(1, 8.0), (2, 4.0)], (1, 2)),  # 4 <= 4 and yet it overflowed
        ([True, False, False], [(1, None), (3, 2.0)], (1, 2)),  # no safe scale: an overflow; 4 > 2 but applied
    ],
)
def test_agreement_counts_steps_whose_overflow_matches_their_scale_against_the_safe_one(overflows, measured, expected):
    run = _run([4.0] * 3, overflows, measured)
    assert headroom(run)[0][:2] == (1, 4.0)
    assert agreement([("a", run)]) == expected


def _results(ceiling_steps=0, accuracies=(0.8, 0.81, 0.79)):
    scales = [2.0**24] * ceiling_steps + [2.0**12] * (4 - ceiling_steps)
    return {
        "fp32": FP32,
        "fp16 dynamic": _run([2.0**14] * 4, [True, False, False, False], [(1, 2.0**13), (3, 2.0**16)], accuracies[0]),
        "fp16 adaptive": _run([2.0**15] * 4, [False] * 4, [(1, 2.0**16), (3, 2.0**16)], accuracies[1]),
        "fp16 automatic": _run(scales, [False] * 4, [(1, 2.0**30), (3, 2.0**30)], accuracies[2]),
    }


def test_the_findings_name_the_winner_of_each_measure_whichever_rule_it_is():
    runs = list(_results().items())[1:]
    assert findings(FP32, runs) == [
        "Fewest skipped steps: fp16 adaptive and fp16 automatic (0).",
        "Closest to the largest safe scale: fp16 dynamic (a median gap of 0.5).",
        "Highest test accuracy: fp16 adaptive (81.00%, fp32 80.00%); the rules differ by 2.00 points, beyond the "
        "test set's noise of 1.5.",
    ]
    close = list(_results(ceiling_steps=3, accuracies=(0.8, 0.8, 0.8)).items())[1:]
    assert findings(FP32, close)[2:] == [
        "Highest test accuracy: fp16 dynamic and fp16 adaptive and fp16 automatic (80.00%, fp32 80.00%); the rules "
        "differ by 0.00 points, within the test set's noise of 1.5.",
        "Automatic loss scaling reached its ceiling (`max_scale`, 2**24) at step 1 and used it at 3 of 4 steps: "
        "where the gradients allow more, the ceiling, not the gradients, sets its scale.",
    ]


def test_the_section_has_a_table_and_a_figure_per_loss_weight():
    section = automatic_section([(1e-4, _results(), "automatic.png"), (1.0, _results(), "a1.png")], "O3")
    assert section.count("| fp32 | 80.00 | | 0.5000 | | | |") == 2
    assert "| fp16 dynamic | 80.00 | +0.00 | 0.5000 | 1 of 4 | 0.5 | 1 of 2 |" in section
    assert "| fp16 automatic | 79.00 | -1.00 | 0.5000 | 0 of 4 | 18 | 0 of 2 |" in section
    assert (
        section.count(
            "A step overflowed exactly when its scale was above its largest safe scale at 6 of 6 measured steps."
        )
        == 2
    )
    assert [line for line in section if line.startswith("### ")] == [
        "### At loss weight 0.0001",
        "### At loss weight 1",
    ]
    assert "| 3 | 2**14 | 2**16 | 2**15 | 2**16 | 2**12 | 2**30 |" in section
    assert (
        section[-2]
        == "![each rule's loss scale against its measured largest safe scale, at loss weight 1](images/a1.png)"
    )
    assert "more than 1e-07 of the gradient values sit at or above 1/16 of float16's largest value" in section[2]
    assert "every step, between 2**0 and 2**24 from 2**16" in section[2]
