"""docs/results.md is what its own command produces: the test reruns that command and compares the pages.

The page names the command that wrote it (``lossscale compare ... --results docs/results.md``, about 50 s
here). Rerun into a temporary folder, the fresh page must equal the committed one line by line, except
the line naming the machine and the date. On the machine the page names (same CPU model and
versions), every number must be equal: the runs are deterministic there. Elsewhere, CPU kernels round
differently and training amplifies it, so numbers must agree within 1.5 plus 10% (accuracy points,
percentages, losses, step counts), and everything else (the configuration, rows, scales' wording) must
be equal but the verdict's words, which follow its numbers ("the same as" or "0.28 percentage points above").
"""

import json
import os
import re
import shlex

import pytest
from nets import TESTS

from lossscale.core._text import format_scale
from lossscale.demo import plots
from lossscale.demo.cli import main
from lossscale.demo.headroom import RULES
from lossscale.demo.results import UNWEIGHTED, _comparison_rows, _window_section, machine_description

ROOT = os.path.dirname(TESTS)
PAGE = os.path.join(ROOT, "docs", "results.md")
NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?")


def _command(text):
    line = next(line.strip() for line in text.splitlines() if line.strip().startswith("python -m lossscale"))
    return shlex.split(line)[3:]  # after "python -m lossscale"


def _machine_line(text):
    return next(line for line in text.splitlines() if line.startswith("on "))


# The verdict's words follow its numbers (a gap of 0.00 is "the same as"; below -0.5 "more than 0.5 below"): where
# numbers may differ, so may these words.
VERDICT_WORDS = re.compile(
    r"the same as|\d+\.\d+ percentage points (?:above|below)"
    r"|(?:not )?more than (?=[\d.]+ below)"
)


def _comparable(line, exact):
    """``line`` as compared: as it is on the page's machine; elsewhere without the verdict's words that follow
    its numbers."""
    return line if exact else VERDICT_WORDS.sub("<verdict>", line)


def _same_numbers(ours, theirs, exact):
    if exact:
        return ours == theirs
    return all(abs(float(a) - float(b)) <= 1.5 + 0.1 * abs(float(b)) for a, b in zip(ours, theirs))


@pytest.mark.slow  # kept long: it is what the test checks (a full run)
def test_committed_results_page_equals_a_fresh_run_of_its_command(tmp_path, capsys, monkeypatch):
    with open(PAGE, encoding="utf-8") as handle:
        committed = handle.read()
    drawn, draw = [], plots.plot_histogram

    def recorded_histogram(log2_magnitudes, scale, path, title):
        drawn.append((scale, os.path.basename(path)))
        return draw(log2_magnitudes, scale, path, title)

    monkeypatch.setattr(plots, "plot_histogram", recorded_histogram)
    arguments = _command(committed)
    assert arguments[0] == "compare" and arguments[-2:] == ["--results", "docs/results.md"]
    fresh_page = tmp_path / "docs" / "results.md"
    assert (
        main([*arguments[:-2], "--no-progress", "--output", str(tmp_path / "run"), "--results", str(fresh_page)]) == 0
    )
    out = capsys.readouterr().out
    table = out[out.index("run ") :].splitlines()
    assert [line.split()[0] for line in table[2:8]] == ["fp32", "fp16", "fp16", "fp16", "fp16", "fp16"]
    assert re.search(r"fp16 dynamic reaches [0-9.]+% test accuracy, .* fp32 \([0-9.]+%\)", out)
    fresh = fresh_page.read_text().replace(str(fresh_page), "docs/results.md")
    runs = json.loads((tmp_path / "run" / "compare.json").read_text())
    for label, result in runs.items():  # the page shows what the run measured, and the run wrote its files
        assert f"| {label} | {100 * result['test_accuracy']:.2f} | " in fresh, label
        row = next(line for line in table[2:] if line.startswith(label + " "))
        unweighted_loss = result["final_loss"] / result["config"]["loss_weight"]
        assert row[len(label) :].split()[:2] == [f"{100 * result['test_accuracy']:.2f}", f"{unweighted_loss:.4f}"], row
    # With a 1e-4 loss weight, fp16 without scaling loses gradient elements and dynamic scaling does not.
    assert runs["fp32"]["gradient_lost_fraction"] == 0.0
    assert runs["fp16 dynamic"]["gradient_lost_fraction"] < 0.01 < runs["fp16 no scaling"]["gradient_lost_fraction"]
    assert (tmp_path / "run" / "compare.png").exists() and (tmp_path / "run" / "compare.txt").exists()
    for label in ("fp16 dynamic", "fp16 adaptive"):  # both windows' skipped steps and scales, on the same seed
        summary = runs[label]["summary"]
        line = next(line for line in fresh.splitlines() if line.startswith(f"- {label}: "))
        assert f"skipped steps {summary['skipped_steps']} of {summary['steps']}," in line
        assert line.endswith(f"ending at {format_scale(summary['final_loss_scale'])}.")
    assert runs["fp16 adaptive"]["config"]["loss_scale"] == "adaptive"
    # The three rules, at both weights, have their largest safe scale measured every 6th step, and every measured
    # step overflowed exactly when its scale was above it (the page's count of agreeing steps).
    measured = {label for label, result in runs.items() if "largest_safe_scales" in result}
    assert measured == {label + suffix for label in RULES for suffix in ("", UNWEIGHTED)}
    steps = runs["fp16 automatic"]["summary"]["steps"]
    assert [step for step, _ in runs["fp16 automatic"]["largest_safe_scales"]] == list(range(1, steps + 1, 6))
    counts = re.findall(r"at (\d+) of (\d+) measured steps\.", fresh)
    assert counts == [(str(3 * len(range(1, steps + 1, 6))),) * 2] * 2
    exact = machine_description() in _machine_line(committed)
    committed_lines, fresh_lines = committed.splitlines(), fresh.splitlines()
    assert len(committed_lines) == len(fresh_lines)
    for old, new in zip(committed_lines, fresh_lines):
        if old.startswith("on ") and new.startswith("on "):
            continue  # the machine and the date
        old, new = _comparable(old, exact), _comparable(new, exact)
        assert NUMBER.sub("#", old) == NUMBER.sub("#", new), (old, new)
        assert _same_numbers(NUMBER.findall(new), NUMBER.findall(old), exact), (
            f"docs/results.md no longer matches its command; regenerate it with "
            f"python -m lossscale {' '.join(arguments)}\ncommitted: {old}\nfresh:     {new}"
        )
    for image in ("compare.png", "inspect-lenet5.png", "automatic.png", "automatic-weight1.png"):
        assert (fresh_page.parent / "images" / image).stat().st_size > 10_000
    assert drawn == [(1.0, "inspect-lenet5.png")]  # the gradients as they are (scale 1) against the float16 range


def test_the_machine_description_names_the_vector_extensions_that_decide_rounding():
    """The page's runs agree bit for bit only on a CPU with the same extensions, so the description that decides
    an exact comparison names them."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            flags = next((line.split(":", 1)[1].split() for line in handle if line.startswith("flags")), [])
    except OSError:
        pytest.skip("no /proc/cpuinfo")
    present = [flag for flag in ("avx2", "fma", "avx512f") if flag in flags]
    assert re.search(r"\(.*" + re.escape(" ".join(present)) + r"\)", machine_description())


@pytest.mark.parametrize(
    "old, new, exact, same",
    [
        ("| fp32 | 81.89 |", "| fp32 | 81.89 |", True, True),
        ("| fp32 | 81.89 |", "| fp32 | 82.17 |", True, False),
        ("| fp32 | 81.89 |", "| fp32 | 82.17 |", False, True),
        ("| fp32 | 81.89 |", "| fp32 | 93.00 |", False, False),
    ],
)
def test_number_comparison(old, new, exact, same):
    assert _same_numbers(NUMBER.findall(new), NUMBER.findall(old), exact) == same


@pytest.mark.parametrize(
    "fresh",
    [
        "fp16 dynamic reaches 82.17% test accuracy, 0.28 percentage points above fp32 (81.89%): "
        "not more than 0.5 below",
        "fp16 dynamic reaches 81.05% test accuracy, 0.84 percentage points below fp32 (81.89%): more than 0.5 below",
        "fp16 dynamic reaches 81.89% test accuracy, the same as fp32 (81.89%): not more than 0.5 below",
    ],
)
def test_elsewhere_the_verdicts_words_may_follow_its_numbers(fresh):
    """Another machine's accuracies may differ within the tolerance, and the verdict's words with them; its
    numbers are still compared (the gap's own number goes with its words)."""
    page = "fp16 dynamic reaches 81.89% test accuracy, the same as fp32 (81.89%): not more than 0.5 below"
    old, new = _comparable(page, exact=False), _comparable(fresh, exact=False)
    assert NUMBER.sub("#", old) == NUMBER.sub("#", new)
    assert _same_numbers(NUMBER.findall(new), NUMBER.findall(old), exact=False)
    assert _comparable(fresh, exact=True) == fresh  # on the page's machine every word must be equal
    assert not _same_numbers(
        NUMBER.findall(_comparable(fresh.replace("81.89%)", "91.89%)"), exact=False)), NUMBER.findall(old), exact=False
    )


def test_a_comparison_row_shows_the_first_steps_scale_and_the_final_scale():
    """The "first -> last" column: the scale the first step used and the one after the last step (the committed
    page cannot tell the first step's scale from the last step's: they are equal there)."""
    result = {
        "config": {"loss_weight": 1e-4},
        "test_accuracy": 0.5,
        "final_loss": 1e-4,
        "gradient_lost_fraction": 0.25,
        "records": [{"loss_scale": 2.0**24}, {"loss_scale": 2.0**20}],
        "summary": {"final_loss_scale": 2.0**21, "skipped_steps": 1, "steps": 2},
    }
    assert _comparison_rows([("fp16 dynamic", result)])[2] == (
        "| fp16 dynamic | 50.00 | 1.0000 | 25.000 | 1 of 2 | 2**24 -> 2**21 |"
    )


def test_the_window_section_counts_changes_and_samples_both_trajectories():
    def result(scales, skipped):
        summary = dict(skipped_steps=skipped, steps=len(scales), min_loss_scale=min(scales))
        summary.update(max_loss_scale=max(scales), final_loss_scale=scales[-1])
        return {"records": [{"loss_scale": scale} for scale in scales], "summary": summary}

    dynamic = result([2.0**24] * 9 + [2.0**25] * 6, 0)
    adaptive = result([2.0**24, 2.0**25, 2.0**26, 2.0**25, 2.0**24] + [2.0**25] * 10, 2)
    section = _window_section([("fp16 dynamic", dynamic), ("fp16 adaptive", adaptive)])
    assert section[2] == (
        "- fp16 dynamic: growths 1, back-offs 0, skipped steps 0 of 15, the scale between 2**24 and 2**25, "
        "ending at 2**25."
    )
    assert section[3].startswith("- fp16 adaptive: growths 3, back-offs 2, skipped steps 2 of 15,")
    table = section[section.index("| step | fp16 dynamic | fp16 adaptive |") :]
    assert [row.split(" | ")[0] for row in table[2:10]] == ["| 1", "| 3", "| 5", "| 7", "| 9", "| 11", "| 13", "| 15"]
    assert table[2:4] == ["| 1 | 2**24 | 2**24 |", "| 3 | 2**24 | 2**26 |"]
