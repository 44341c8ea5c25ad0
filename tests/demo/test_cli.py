"""The command line: short runs of train/compare/inspect, their files and reports, the help, and one-line
errors with exit code 2 for every kind of bad input."""

import csv
import json
import os
import re
import subprocess
import sys

import mindspore as ms
import numpy as np
import pytest
from nets import TESTS

from lossscale import get_preset
from lossscale.demo.cli import main
from lossscale.demo.diagnostics import GradientProbe, lost_fraction, magnitude_report, unscaled_gradients
from lossscale.demo.inspection import scale_advice
from lossscale.demo.msrun import LAUNCHED_MARK
from lossscale.demo.options import (
    EXIT_STALLED,
    EXIT_USAGE,
    CliError,
    _check_batch_size,
    build_parser,
    default_output,
    parse_loss_scale,
)
from lossscale.demo.results import comparison_verdict
from lossscale.demo.runs import CLI_OVERFLOW_ADVICE, nothing_trained, run_training, stall_warning

ROOT = os.path.dirname(TESTS)
TINY = ["--model", "mlp", "--epochs", "1", "--batch-size", "128", "--no-progress"]


def _one_error_line(capsys, pattern, prefix="lossscale: error: "):
    err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("[")]
    assert len(err) == 1 and err[0].startswith(prefix), err
    assert pattern in err[0], err[0]


def _cli(arguments, cwd, timeout=300):
    """``python -m lossscale ...`` in a fresh process started in ``cwd``."""
    return subprocess.run(
        [sys.executable, "-m", "lossscale", *arguments],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=cwd,
    )


@pytest.mark.slow
def test_train_writes_metrics_summary_and_plot(tmp_path, capsys):
    assert main(["train", *TINY, "--output", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "test accuracy:" in out and "loss scaling:" in out and "max 2**24" in out
    with open(tmp_path / "metrics.csv", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 1438 // 128
    assert [int(r["step"]) for r in rows] == list(range(1, len(rows) + 1))
    assert float(rows[0]["loss_scale"]) == 2.0**24  # the scale the first step used, before any update
    assert all(float(a["next_loss_scale"]) == float(b["loss_scale"]) for a, b in zip(rows, rows[1:]))
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["summary"]["steps"] == len(rows) and summary["summary"]["max_loss_scale"] == 2.0**24
    assert summary["config"]["loss_scale"] == "dynamic" and 0.0 <= summary["test_accuracy"] <= 1.0
    assert summary["summary"]["skipped_steps"] == sum(r["overflow"] == "True" for r in rows)
    assert summary["stalled_by_overflow"] is False
    assert (tmp_path / "training.png").stat().st_size > 10_000
    assert set(summary) == {
        "config",
        "summary",
        "test_accuracy",
        "final_loss",
        "seconds_per_step",
        "first_step_seconds",
        "stalled_by_overflow",
    }  # the steps are in metrics.csv
    test_images = 1797 - 1438  # every one counts, the last partial batch of 64 too
    assert summary["test_accuracy"] * test_images == pytest.approx(round(summary["test_accuracy"] * test_images))
    assert main(["train", *TINY, "--output", str(tmp_path)]) == 0
    assert f"note: replacing metrics.csv, summary.json, training.png in {tmp_path}" in capsys.readouterr().err
    timing = ("seconds_per_step", "first_step_seconds")
    again = json.loads((tmp_path / "summary.json").read_text())
    assert {k: v for k, v in again.items() if k not in timing} == {k: v for k, v in summary.items() if k not in timing}


def test_the_step_timer_keeps_the_compiling_first_step_apart(monkeypatch):
    """first_step_seconds: from the start of training to the first step's end; the step time: the median gap
    between later step ends."""
    from lossscale.demo.runs import _step_timer

    clock = iter([10.0, 13.0, 13.5, 14.5, 14.7])
    monkeypatch.setattr("lossscale.demo.runs.time.perf_counter", lambda: next(clock))
    timer = _step_timer()
    assert np.isnan(timer.first_step_seconds()) and np.isnan(timer.median_step_seconds())
    timer.on_train_begin(None)
    for _ in range(4):
        timer.on_train_step_end(None)
    assert timer.first_step_seconds() == 3.0
    assert timer.median_step_seconds() == pytest.approx(0.5)  # of 0.5, 1.0 and 0.2


@pytest.mark.parametrize("rank, files", [(0, ["metrics.csv", "summary.json", "training.png"]), (1, [])])
@pytest.mark.slow
def test_under_msrun_only_rank_0_writes_and_prints_the_report(rank, files, tmp_path, capsys, monkeypatch):
    """Every msrun worker runs the whole command on its share of the data; rank 0 alone writes the outputs and
    prints the report and the progress bar (two ranks writing the same files would race). One process plays rank
    ``rank`` of 2: msrun's environment and the communication's initialisation are stood in for, the training is
    real."""
    monkeypatch.setenv("MS_ROLE", "MS_WORKER")
    monkeypatch.setattr("lossscale.demo.msrun.init_data_parallel", lambda: (rank, 2))
    assert (
        main(
            [
                "train",
                "--model",
                "mlp",
                "--epochs",
                "1",
                "--batch-size",
                "128",
                "--workers",
                "2",
                "--output",
                str(tmp_path),
            ]
        )
        == 0
    )
    assert sorted(os.listdir(tmp_path)) == files
    out, err = capsys.readouterr()
    assert out.startswith(f"rank {rank} of 2: per-rank batch 128, global batch 256")
    assert ("test accuracy:" in out) == ("epoch 1/1" in err) == (rank == 0)
    if files:
        with open(tmp_path / "metrics.csv", encoding="utf-8") as handle:
            assert len(list(csv.DictReader(handle))) == 719 // 128  # this rank's half of the 1438 images


@pytest.mark.slow
def test_train_shows_and_plots_the_unweighted_loss_and_the_scale(tmp_path, capsys, monkeypatch):
    """The progress bar, the final line and the plot show the cross-entropy, not the loss times --loss-weight (the
    summary's records keep the weighted loss, the one that was trained)."""
    plotted = []
    monkeypatch.setattr(
        "lossscale.demo.plots.plot_training", lambda records, path, title: plotted.append(records) or path
    )
    assert (
        main(
            [
                "train",
                "--model",
                "mlp",
                "--epochs",
                "1",
                "--batch-size",
                "256",
                "--loss-weight",
                "1e-4",
                "--output",
                str(tmp_path),
            ]
        )
        == 0
    )
    out, err = capsys.readouterr()
    assert "epoch 1/1" in err and "scale=2**" in err and "skipped=" in err
    losses = [float(v) for v in re.findall(r"loss=([0-9.]+)", err)]
    assert losses and min(losses) > 0.1  # the cross-entropy, not the loss times 1e-4
    weighted_final = json.loads((tmp_path / "summary.json").read_text())["final_loss"]
    printed_final = float(re.search(r"final loss: ([0-9.]+)", out).group(1))
    assert printed_final == pytest.approx(weighted_final / 1e-4, abs=1e-4) and printed_final > 0.1
    with open(tmp_path / "metrics.csv", encoding="utf-8") as handle:
        weighted = [float(row["loss"]) for row in csv.DictReader(handle)]
    np.testing.assert_allclose([record["loss"] for record in plotted[0]], np.array(weighted) / 1e-4, rtol=1e-6)


def test_the_demo_without_tqdm_says_how_to_install_it(tmp_path, capsys, monkeypatch):
    """tqdm is the demo's extra, not the library's: without it a command says so in one line."""
    monkeypatch.setitem(sys.modules, "tqdm", None)
    monkeypatch.delitem(sys.modules, "lossscale.demo.runs", raising=False)
    assert main(["train", *TINY, "--output", str(tmp_path)]) == EXIT_USAGE
    _one_error_line(capsys, 'the demo needs tqdm, which is not installed: pip install "lossscale[demo]"')


@pytest.mark.slow
def test_train_without_matplotlib_says_so_in_one_line(tmp_path, capsys, monkeypatch):
    """No plot, and not the previous run's plot either beside this run's results."""
    (tmp_path / "training.png").write_bytes(b"an earlier run's plot")
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert main(["train", *TINY, "--loss-scale", "fixed:128", "--output", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert "plot: matplotlib is not installed" in out and "Traceback" not in out
    assert f"note: replacing training.png in {tmp_path}" in err
    assert not (tmp_path / "training.png").exists() and (tmp_path / "metrics.csv").exists()


@pytest.mark.parametrize("batch_size, workers", [(1438, 1), (719, 2), (480, 3)])
def test_a_batch_size_of_a_workers_whole_share_is_accepted(batch_size, workers):
    """The boundary of the refusals in test_bad_arguments_give_one_line_and_exit_2 (1439, 720 and 481): one full
    batch per worker is enough (each of 3 workers gets ceil(1438 / 3) = 480 images)."""
    assert _check_batch_size(batch_size, workers) == batch_size


def test_run_training_refuses_a_batch_larger_than_the_data_before_training():
    """run_training (the command line's engine, also called from Python) checks the dataset's own number of
    steps: an empty epoch would train nothing and report the untrained network."""
    with pytest.raises(CliError, match="--batch-size 1439 is larger than the 1438 training images"):
        run_training("mlp", batch_size=1439, epochs=1, progress=False)


def _records(flags):
    return {"records": [{"overflow": flag} for flag in flags], "config": {"loss_scale": "dynamic"}}


@pytest.mark.parametrize(
    "flags, stalled",
    [
        ([], False),  # no step at all: nothing to warn about
        ([True] * 3, False),  # no step applied: nothing_trained's error instead
        ([True] * 20 + [False] + [True] * 5 + [False] * 44, True),  # 5 of the 50 steps from the first applied one
        ([True] * 20 + [False] + [True] * 4 + [False] * 45, False),  # 4: fewer than 5
        ([False] + [True] * 6 + [False] * 63, False),  # 6 of 70: fewer than 10%
        ([False] + [True] * 7 + [False] * 62, True),  # 7 of 70: 10%
    ],
)
def test_stall_warning_counts_from_the_first_applied_step(flags, stalled):
    """Stalled: at least 10% (and at least 5) of the steps from the first applied one skipped; the backoffs before
    it are how a dynamic scale finds its level. A run with no step applied has nothing_trained's error."""
    warning = stall_warning(_records(flags))
    assert (warning is not None) == stalled, warning
    if stalled:
        assert f"{sum(flags)} of {len(flags)} steps" in warning
    assert (nothing_trained(_records(flags)) is not None) == (bool(flags) and all(flags))


def test_counts_of_one_read_in_the_singular():
    assert "the weights were updated on 1 step only" in stall_warning(_records([False] + [True] * 5))
    assert "nothing was trained: the 1 step overflowed and was skipped." in nothing_trained(_records([True]))


@pytest.mark.slow
def test_a_run_stalled_by_overflow_says_so_or_stops(tmp_path, capsys):
    """A run that applied no step exits 1 with one line saying so, after writing its results; the advice names the
    command line's options, never the library's (debug_overflow=True, min_loss_scale have no flag)."""
    too_large = ["train", *TINY, "--loss-scale", "fixed:1e10"]
    assert main([*too_large, "--max-consecutive-overflows", "3", "--output", str(tmp_path / "warn")]) == EXIT_STALLED
    err = capsys.readouterr().err
    persistent = [line for line in err.splitlines() if line.startswith("lossscale: warning: Persistent overflow")]
    assert (
        len(persistent) == 1
        and "at step 3: 3 consecutive overflowing steps (--max-consecutive-overflows 3)" in persistent[0]
    )  # warn: once
    stopped = [line for line in err.splitlines() if line.startswith("lossscale: training stopped: ")]
    assert stopped == [
        "lossscale: training stopped: nothing was trained: all 11 steps overflowed and were skipped. "
        f"{CLI_OVERFLOW_ADVICE}"
    ]
    assert "debug_overflow" not in err and "min_loss_scale" not in err and "WARNING" not in err
    assert json.loads((tmp_path / "warn" / "summary.json").read_text())["stalled_by_overflow"] is True
    assert (
        main(
            [
                *too_large,
                "--overflow-policy",
                "raise",
                "--max-consecutive-overflows",
                "3",
                "--output",
                str(tmp_path / "raise"),
            ]
        )
        == EXIT_STALLED
    )
    _one_error_line(
        capsys,
        f"3 consecutive overflowing steps (--max-consecutive-overflows 3); loss scale 1e+10, "
        f"3 steps skipped so far. Every overflowing step is skipped, so training is not "
        f"progressing. {CLI_OVERFLOW_ADVICE}",
        prefix="lossscale: training stopped: ",
    )


GPU = "GPU is available" if ms.hal.is_available("GPU") else None


@pytest.mark.parametrize(
    "arguments, pattern",
    [
        (["train", "--model", "vgg"], "unknown model 'vgg'"),
        (
            ["train", "--loss-scale", "fixed:abc"],
            "fixed:S needs a number S in [1, 3.4e38] (float32's range), but got 'abc'",
        ),
        (["train", "--loss-scale", "fixed:0.5"], "but got '0.5'"),
        (["train", "--loss-scale", "fixed:1e39"], "but got '1e39'"),
        (["train", "--loss-scale", "fixed:nan"], "but got 'nan'"),
        (["train", "--loss-scale", "auto"], "'adaptive[:MIN:MAX]', 'automatic[:PERIOD]' or 'preset:NAME'"),
        (["train", "--loss-scale", "preset:tensorflow"], "unknown preset 'tensorflow'"),
        (["train", "--epochs", "0"], "--epochs: must be an integer in [1, 2147483647], got '0'"),
        (["train", "--epochs", "1.5"], "--epochs: must be an integer in [1, 2147483647], got '1.5'"),
        (["train", "--batch-size", "-3"], "--batch-size: must be an integer in [1, 2147483647]"),
        (["train", "--batch-size", "5000"], "--batch-size 5000 is larger than the 1438 training images"),
        (
            [
                "train",
                "--workers",
                "2",
                "--batch-size",
                "720",
            ],  # said "larger than the 1438", from a worker, after msrun
            "--batch-size 720 is larger than the 719 training images of each of the 2 workers (1438 in all)",
        ),
        (
            [
                "train",
                "--workers",
                "3",
                "--batch-size",
                "481",
            ],  # MindSpore gives each of 3 workers ceil(1438 / 3) images
            "--batch-size 481 is larger than the 480 training images of each of the 3 workers (1438 in all)",
        ),
        (["train", "--precision", "fp8"], "--precision"),
        (["train", "--lr", "-1"], "--lr: must be a number in [1.2e-38, 3.4e38] (float32's normal range), got '-1'"),
        (["train", "--lr", "nan"], "--lr: must be a number in [1.2e-38, 3.4e38] (float32's normal range), got 'nan'"),
        (["train", "--lr", "inf"], "--lr: must be a number in [1.2e-38, 3.4e38] (float32's normal range), got 'inf'"),
        (["train", "--seed", "-1"], "--seed: must be an integer in [0, 2**32-1], got '-1'"),
        (["train", "--seed", "4294967296"], "--seed: must be an integer in [0, 2**32-1]"),
        (["train", "--loss-weight", "0"], "--loss-weight: must be a number in [1.2e-38, 3.4e38]"),
        (["train", "--scale-window", "0"], "--scale-window: must be an integer in [1, 2147483647]"),
        # Beyond int32 or float32: MindSpore's error (a traceback, exit 1), or a loss weight of inf that trained nothing
        (["train", "--scale-window", "99999999999"], "--scale-window: must be an integer in [1, 2147483647], got"),
        (["train", "--epochs", "100000000000"], "--epochs: must be an integer in [1, 2147483647], got"),
        (
            ["train", "--loss-weight", "1e39"],
            "--loss-weight: must be a number in [1.2e-38, 3.4e38] (float32's normal range), got '1e39'",
        ),
        (["train", "--loss-weight", "1e-39"], "--loss-weight: must be a number in [1.2e-38, 3.4e38]"),
        (["train", "--lr", "1e39"], "--lr: must be a number in [1.2e-38, 3.4e38]"),
        (["train", "--workers", "0"], "--workers: must be an integer in [1, 2147483647]"),
        (["train", "--overflow-policy", "ignore"], "--overflow-policy"),
        (
            ["train", "--max-consecutive-overflows", "0"],
            "--max-consecutive-overflows: must be an integer in [1, 2147483647]",
        ),
        (["train", "--device", "TPU"], "--device"),
        pytest.param(
            ["train", "--device", "GPU"],
            "--device GPU is not available",
            marks=pytest.mark.skipif(GPU is not None, reason="this machine has a GPU"),
        ),
        (["compare", "--model", "vgg"], "unknown model"),
        (["compare", "--precision", "fp32"], "--precision: invalid choice: 'fp32'"),
        (
            ["compare", "--fixed-scale", "0.5"],
            "--fixed-scale: must be a number in [1, 3.4e38] (float32's range), got '0.5'",
        ),
        (["compare", "--fixed-scale", "1e39"], "--fixed-scale: must be a number in [1, 3.4e38]"),
        (["inspect", "--scale", "0"], "--scale: must be a number in (0, 3.4e38] (float32's range), got '0'"),
        (["inspect", "--scale", "1e39"], "--scale: must be a number in (0, 3.4e38]"),
        (["inspect", "--scale", "inf"], "--scale: must be a number in (0, 3.4e38]"),
        (["inspect", "--precision", "O0"], "--precision: invalid choice: 'O0'"),
        (["inspect", "--epochs", "-1"], "--epochs: must be an integer in [0, 2147483647], got '-1'"),
        (["inspect", "--batches", "0"], "--batches: must be an integer in [1, 2147483647]"),
        (["inspect", "--loss-scale", "dynamic"], "unrecognized arguments: --loss-scale"),
        (["inspect", "--batch-size", "1439"], "--batch-size 1439 is larger than the 1438 training images"),
        (["compare", "--batch-size", "5000"], "--batch-size 5000 is larger than the 1438 training images"),
        (["fly"], "invalid choice"),
    ],
)
def test_bad_arguments_give_one_line_and_exit_2(arguments, pattern, capsys, tmp_path):
    assert main([*arguments, "--output", str(tmp_path)] if arguments != ["fly"] else arguments) == EXIT_USAGE
    _one_error_line(capsys, pattern)


def test_unwritable_output_folder(tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    assert main(["train", *TINY, "--output", str(blocker / "sub")]) == EXIT_USAGE
    _one_error_line(capsys, "cannot write to output folder")


def test_help_shows_each_commands_own_defaults():
    helps = {
        command: build_parser()._subparsers._group_actions[0].choices[command].format_help()
        for command in ("train", "compare", "inspect")
    }
    flat = {command: " ".join(text.split()) for command, text in helps.items()}
    assert "(default: 0.0001)" in flat["compare"] and "(default: 1.0)" in flat["train"]  # --loss-weight
    for command in ("train", "compare", "inspect"):
        assert "initialisation and data order (default: 0)" in flat[command]
        assert "images per step" in flat[command] and "(default: 32)" in flat[command]
    assert "passes over the 1438 training images (default: 6)" in flat["train"]
    assert "passes over the 1438 training images (default: 3)" in flat["compare"]
    assert "(0: the untrained network only) (default: 0)" in flat["inspect"]
    assert "--scale-window" not in flat["inspect"] and "--loss-scale" not in flat["inspect"]
    assert "{O2,O3}" in flat["compare"] and "{O2,O3}" in flat["inspect"]
    assert "no progress bars" in flat["train"] and "(default: False)" not in flat["train"]  # a flag has no default


@pytest.mark.slow
def test_inspect_reports_underflow_that_a_larger_scale_removes(tmp_path, capsys):
    common = ["inspect", "--model", "mlp", "--batches", "1", "--loss-weight", "1e-3", "--no-progress"]
    assert main([*common, "--output", str(tmp_path / "s1")]) == 0
    assert main([*common, "--scale", "65536", "--output", str(tmp_path / "s2")]) == 0
    low = json.loads((tmp_path / "s1" / "inspect.json").read_text())
    high = json.loads((tmp_path / "s2" / "inspect.json").read_text())
    assert low["flushed"] > 0.01 and high["flushed"] < low["flushed"] / 10
    assert high["measured_lost_fraction"] < low["measured_lost_fraction"]
    assert low["largest_safe_scale"] == high["largest_safe_scale"] >= 65536
    assert (tmp_path / "s1" / "gradients.png").exists()
    out = capsys.readouterr().out
    assert "at the untrained weights" in out and "Not a fixed scale to train with" in out


@pytest.mark.slow
def test_inspect_reports_the_batches_it_measured(tmp_path, capsys):
    """--batches beyond the training split measured the batches there are but said it measured --batches (and
    --batch-size beyond the split crashed with a traceback, exit 1: now exit 2, above)."""
    assert (
        main(
            [
                "inspect",
                "--model",
                "mlp",
                "--batches",
                "100",
                "--batch-size",
                "700",
                "--no-progress",
                "--output",
                str(tmp_path),
            ]
        )
        == 0
    )
    assert json.loads((tmp_path / "inspect.json").read_text())["batches"] == 2  # 1438 // 700
    assert "untrained, 2 batches)" in capsys.readouterr().out


@pytest.mark.slow
def test_inspect_advice_holds_for_the_training_it_describes(tmp_path, capsys):
    """The suggested fixed scale, measured along 3 epochs, trains those 3 epochs without a skipped step;
    4x the suggestion (above the smallest largest-safe scale of the trajectory) skips some."""
    common = ["--model", "mlp", "--epochs", "3", "--no-progress"]
    assert main(["inspect", *common, "--output", str(tmp_path / "inspect")]) == 0
    report = json.loads((tmp_path / "inspect" / "inspect.json").read_text())
    suggested = report["suggested_fixed_scale"]
    assert [epoch for epoch, _ in report["largest_safe_along_training"]] == [0, 1, 2, 3]
    assert "Suggested fixed scale: 2**" in capsys.readouterr().out
    skipped = {}
    for factor in (1, 4):
        output = tmp_path / f"train{factor}"
        assert (
            main(
                [
                    "train",
                    *common,
                    "--precision",
                    "O2",
                    "--loss-scale",
                    f"fixed:{suggested * factor:g}",
                    "--output",
                    str(output),
                ]
            )
            == 0
        )
        skipped[factor] = json.loads((output / "summary.json").read_text())["summary"]["skipped_steps"]
    assert skipped[1] == 0 and skipped[4] > 0


@pytest.mark.slow
def test_train_with_a_preset(tmp_path):
    """Megatron's rule starts at 2**32 and backs off after two overflows: 44 steps of 32 images find its level."""
    arguments = ["train", *TINY, "--batch-size", "32", "--loss-scale", "preset:megatron", "--output", str(tmp_path)]
    assert main(arguments) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["config"]["loss_scale"] == "preset:megatron"
    assert summary["summary"]["max_loss_scale"] == 2.0**32 and summary["summary"]["skipped_steps"] < 44


@pytest.mark.slow
def test_train_with_automatic_loss_scaling(tmp_path):
    """--loss-scale automatic: from 2**16 the scale moves by factors of 2 at every step, within the rule's bounds."""
    arguments = ["train", *TINY, "--batch-size", "32", "--loss-scale", "automatic", "--output", str(tmp_path)]
    assert main(arguments) == 0
    with open(tmp_path / "metrics.csv", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    scales = [float(row["loss_scale"]) for row in rows] + [float(rows[-1]["next_loss_scale"])]
    assert all(
        after in (before * 2, before / 2) or after in (before, 1.0, 2.0**24)
        for before, after in zip(scales, scales[1:])
    )
    assert json.loads((tmp_path / "summary.json").read_text())["config"]["loss_scale"] == "automatic"


@pytest.mark.slow
def test_train_with_the_adaptive_window(tmp_path):
    """--loss-scale adaptive:MIN:MAX: MindFormers' rule from MindSpore's 2**24, its scale trajectory in
    metrics.csv that of the rule given the run's own overflow flags."""
    from lossscale.core.adaptive import AdaptiveWindowRule, run_adaptive

    spec = ["--loss-scale", "adaptive:4:40", "--scale-window", "4"]
    assert main(["train", *TINY, "--batch-size", "32", *spec, "--output", str(tmp_path)]) == 0
    with open(tmp_path / "metrics.csv", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    flags = [row["overflow"] == "True" for row in rows]
    expected = [state.scale for state in run_adaptive(AdaptiveWindowRule(2.0**24, 2, 4, 40, 4), flags)]
    assert [float(row["next_loss_scale"]) for row in rows] == expected and any(flags) and not all(flags)
    assert json.loads((tmp_path / "summary.json").read_text())["config"]["loss_scale"] == "adaptive:4:40"


def test_parse_loss_scale():
    assert parse_loss_scale("none")[1]().get_drop_overflow_update() is False
    label, factory = parse_loss_scale("dynamic", scale_window=7)
    assert label == "dynamic" and factory().scale_window == 7
    label, factory = parse_loss_scale("preset:pytorch", scale_window=7)  # --scale-window applies to a preset too
    assert label == "preset:pytorch" and factory().scale_window == 7 and factory().get_loss_scale() == 2.0**16
    manager = parse_loss_scale("preset:mindformers", scale_window=100)[1]()  # the adaptive window, starting at 100
    assert manager.policy == get_preset("mindformers", scale_window=100)  # any rule, behind the dynamic manager's API
    assert parse_loss_scale("automatic")[1]().policy == get_preset("graphcore")  # PopART's period of 1
    assert parse_loss_scale("automatic:5", scale_window=7)[1]().policy == get_preset("graphcore", update_period=5)
    with pytest.raises(CliError):
        parse_loss_scale("fixed:inf")
    label, factory = parse_loss_scale("fixed:1")  # the lowest scale allowed
    assert label == "fixed:1" and factory().get_loss_scale() == 1.0
    label, factory = parse_loss_scale("adaptive", scale_window=100)  # MindFormers' bounds, starting at 100
    manager = factory()
    assert label == "adaptive" and manager.rule.levels == (20, 30, 40, 50, 100, 200, 500, 1000)
    assert manager.state_dict()["scale_window"] == 100 and manager.get_loss_scale() == 2.0**24
    label, factory = parse_loss_scale("adaptive:10:400", scale_window=10)
    assert label == "adaptive:10:400" and factory().rule.levels[0] == 10 and factory().rule.levels[-1] == 400


@pytest.mark.parametrize(
    "spec, message",
    [
        ("adaptive:20", "needs two whole numbers"),
        ("adaptive:0:100", "needs two whole numbers"),
        ("adaptive:a:100", "needs two whole numbers"),
        ("adaptive:100:20", "needs MIN < MAX"),
        ("adaptive:20:20", "needs MIN < MAX"),
        ("adaptiv", "'adaptive[:MIN:MAX]'"),
        ("automatic:0", "automatic:PERIOD needs a whole number of steps >= 1"),
        ("automatic:x", "automatic:PERIOD needs a whole number of steps >= 1"),
        ("automatic:", "automatic:PERIOD needs a whole number of steps >= 1"),
    ],
)
def test_bad_adaptive_bounds_are_one_line_errors(spec, message):
    with pytest.raises(CliError, match=re.escape(message)):
        parse_loss_scale(spec)


@pytest.mark.parametrize(
    "fp32, dynamic, relation",
    [
        (0.9666, 0.9610, "0.56 percentage points below fp32 (96.66%): more than 0.5 below"),
        (0.9666, 0.9630, "0.36 percentage points below fp32 (96.66%): not more than 0.5 below"),
        (0.9610, 0.9666, "0.56 percentage points above fp32 (96.10%): not more than 0.5 below"),
        (0.9666, 0.96662, "the same as fp32 (96.66%): not more than 0.5 below"),
        (0.9666, 0.9670, "0.04 percentage points above fp32 (96.66%): not more than 0.5 below"),
        (0.97, 0.965, "0.50 percentage points below fp32 (97.00%): not more than 0.5 below"),  # exactly -0.5
    ],
)
def test_comparison_verdict(fp32, dynamic, relation):
    runs = [("fp32", {"test_accuracy": fp32}), ("fp16 dynamic", {"test_accuracy": dynamic})]
    assert comparison_verdict(runs) == f"fp16 dynamic reaches {100 * dynamic:.2f}% test accuracy, {relation}"


@pytest.mark.parametrize(
    "trajectory, smallest",
    [
        ([(0, 2.0**19), (1, 2.0**16), (2, 2.0**17)], "2**16, at epoch 1. Suggested fixed scale: 2**15"),
        ([(0, 2.0**15), (1, 2.0**17), (2, 2.0**16)], "2**15, at epoch 0. Suggested fixed scale: 2**14"),  # untrained
    ],
)
def test_scale_advice_names_the_smallest_safe_scale_and_its_epoch(trajectory, smallest):
    assert f"the smallest, {smallest} (half of it)" in scale_advice(trajectory)


def test_inspect_measures_the_same_network_for_the_same_seed():
    from lossscale.demo.inspection import largest_safe_along_training

    args = build_parser().parse_args(["inspect", "--model", "mlp", "--epochs", "0", "--batches", "1"])
    (first, trajectory), (second, again) = largest_safe_along_training(args), largest_safe_along_training(args)
    assert trajectory == again
    for a, b in zip(first.get_parameters(), second.get_parameters()):
        np.testing.assert_array_equal(a.asnumpy(), b.asnumpy(), err_msg=a.name)


def test_a_failed_msrun_launch_is_a_one_line_error_naming_the_logs(tmp_path, capsys, monkeypatch):
    """msrun exiting with an error (a worker failed) is exit code 2 with the worker logs' folder, not success."""
    launched = []

    def failing_msrun(command, timeout, env=None, cwd=None):
        launched.append(command)
        return subprocess.CompletedProcess(command, 1, "", None)

    monkeypatch.setattr("lossscale.demo.msrun.run_msrun", failing_msrun)
    monkeypatch.delenv(LAUNCHED_MARK, raising=False)
    monkeypatch.delenv("MS_ROLE", raising=False)
    assert main(["train", *TINY, "--workers", "2", "--output", str(tmp_path)]) == EXIT_USAGE
    assert "--worker_num=2" in launched[0]
    _one_error_line(capsys, f"msrun failed with exit code 1; worker logs are in {tmp_path / 'msrun_logs'}")


@pytest.mark.parametrize(
    "arguments, folder",
    [
        (["train"], "train-lenet5-O2-dynamic"),
        (["train", "--loss-scale", "fixed:1024"], "train-lenet5-O2-fixed-1024"),
        (["train", "--loss-scale", "fixed:1024", "--workers", "2"], "train-lenet5-O2-fixed-1024-2workers"),
        (["train", "--precision", "fp32", "--loss-scale", "none"], "train-lenet5-fp32-none"),
        (["train", "--model", "mlp", "--loss-scale", "preset:pytorch"], "train-mlp-O2-preset-pytorch"),
        (["compare", "--model", "mlp", "--precision", "O2"], "compare-mlp-O2"),
        (["inspect"], "inspect-lenet5-O3"),
    ],
)
def test_each_configuration_has_a_results_folder_of_its_own(arguments, folder):
    """Without --output a run writes to runs/<command>-<configuration>: runs of other settings keep theirs."""
    args = build_parser().parse_args(arguments)
    assert default_output(args.command, args) == os.path.join("runs", folder)


def test_msrun_logs_go_into_the_runs_own_folder(tmp_path, capsys, monkeypatch):
    """With --workers and no --output, msrun writes its worker logs inside the run's folder, and nothing of
    another configuration's folder is touched."""
    other = tmp_path / "runs" / "train-mlp-O2-dynamic"
    other.mkdir(parents=True)
    (other / "metrics.csv").write_text("kept")
    monkeypatch.setattr(
        "lossscale.demo.msrun.run_msrun", lambda command, timeout, env=None: subprocess.CompletedProcess(command, 1)
    )
    monkeypatch.delenv(LAUNCHED_MARK, raising=False)
    monkeypatch.delenv("MS_ROLE", raising=False)
    monkeypatch.chdir(tmp_path)
    assert main(["train", *TINY, "--workers", "2"]) == EXIT_USAGE
    logs = tmp_path / "runs" / "train-mlp-O2-dynamic-2workers" / "msrun_logs"
    _one_error_line(capsys, f"worker logs are in {logs}")
    assert (other / "metrics.csv").read_text() == "kept"


@pytest.mark.slow
def test_entry_points_version_and_no_clash_with_a_users_own_models(tmp_path, monkeypatch):
    """Run from a folder holding its own models.py and models/ (common in ML projects): lossscale's demo
    networks are lossscale_models, so the user's code is neither imported nor shadowed. MindSpore's own warnings
    stay off (MindSpore 2.10's nn.Adam logs a deprecation of a kernel it builds) when GLOG_v is not set."""
    from importlib.metadata import distribution

    monkeypatch.delenv("GLOG_v", raising=False)  # an in-process main() of another test may have set it

    scripts = {e.name: e.value for e in distribution("lossscale").entry_points if e.group == "console_scripts"}
    assert scripts.get("lossscale") == "lossscale.__main__:main"
    (tmp_path / "models.py").write_text("raise ImportError('the user models.py was imported')\n")
    (tmp_path / "data").mkdir()
    done = _cli(["train", *TINY, "--output", "out"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "test accuracy:" in done.stdout and (tmp_path / "out" / "metrics.csv").exists()
    assert "[WARNING] ME" not in done.stderr, done.stderr[-2000:]
    version = _cli(["--version"], cwd=tmp_path)
    assert version.returncode == 0 and re.fullmatch(r"lossscale \S+ \(MindSpore \S+\)\n", version.stdout)
    assert sorted(os.listdir(tmp_path)) == ["data", "models.py", "out"]  # nothing written outside --output


def test_module_help_answers_without_importing_mindspore():
    code = (
        "import sys; from lossscale.demo.cli import main\ntry:\n    main(['train', '--help'])\nexcept SystemExit:\n"
        "    pass\nprint('mindspore' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert done.stdout.strip().endswith("False") and "--loss-scale" in done.stdout


def test_the_cli_knows_every_demo_model_without_importing_them():
    from lossscale.demo.options import MODEL_NAMES
    from lossscale_models import MODELS

    assert set(MODEL_NAMES) == set(MODELS)


# ---- diagnostics (what `inspect` and `compare` report) ----------------------------------------------------

# (|g| * scale, where it lands in float16): float16 rounds to nearest, ties to even
LANDINGS = [
    (2.0**-26, "flushed"),
    (2.0**-25, "flushed"),  # half the smallest subnormal: a tie, rounded to the even 0
    (2.0**-25 * (1 + 2.0**-10), "subnormal"),  # rounds up to 2**-24
    (2.0**-15, "subnormal"),
    (2.0**-14 * (1 - 2.0**-13), "normal"),  # rounds up to the smallest normal
    (1.0, "normal"),
    (65519.0, "normal"),  # rounds down to 65504
    (65520.0, "overflow"),  # a tie between 65504 and the next step, rounded to inf
    (1e6, "overflow"),
]


def _half(value):
    """``value`` cast to float16 (inf above the range, without numpy's warning)."""
    with np.errstate(over="ignore"):
        return np.float16(value)


@pytest.mark.parametrize("value, landing", LANDINGS)
@pytest.mark.parametrize("scale", [1.0, 8.0])
def test_magnitude_report_classifies_as_float16_rounds(value, landing, scale):
    """It counted 2**-25 as kept and 65504 < x < 65520 as overflowing; float16 itself does the opposite."""
    report = magnitude_report([np.array([value / scale])], scale)
    assert report[landing] == 1.0 and report["count"] == 1
    assert bool(_half(value) == 0) == (landing == "flushed")
    assert bool(np.isinf(_half(value))) == (landing == "overflow")


@pytest.mark.parametrize(
    "largest, safe", [(1.0, 2.0**15), (65519.0 / 4, 4.0), (65520.0 / 4, 2.0), (65504.0, 1.0), (2.0**-20, 2.0**35)]
)
def test_largest_safe_scale_is_the_largest_power_of_two_that_stays_finite(largest, safe):
    assert magnitude_report([np.array([largest, 1e-30])], 1.0)["largest_safe_scale"] == safe
    assert np.isfinite(_half(largest * safe)) and np.isinf(_half(largest * safe * 2))


@pytest.mark.parametrize(
    "reference, candidate, lost",
    [
        ([[1.0, 2.0, 0.0]], [[0.0, 2.0, 0.0]], 0.5),  # a zero where fp32 has none is lost; zero in both is not
        ([[1.0, -3.0], [4.0]], [[1.0, 0.0], [0.0]], 2 / 3),  # over every tensor
        ([[1.0]], [[np.inf]], 0.0),  # an overflow is not an element lost to underflow
        ([[0.0, 0.0]], [[0.0, 0.0]], 0.0),  # nothing to lose
    ],
)
def test_lost_fraction_counts_elements_flushed_to_zero(reference, candidate, lost):
    assert lost_fraction([np.array(r) for r in reference], [np.array(c) for c in candidate]) == pytest.approx(lost)


class _HalfLoss(ms.nn.Cell):
    """``sum(w * x) * 1e-4`` computed in float16 (a float16 loss, as a network in O3 without a float32 loss has)."""

    def __init__(self):
        super().__init__()
        self.w = ms.Parameter(ms.Tensor(np.ones(2, np.float32)), name="w")

    def construct(self, x):
        return (ms.ops.cast(self.w, ms.float16) * x).sum() * ms.Tensor(1e-4, ms.float16)


def test_gradient_probe_takes_a_float16_loss_and_unscales_its_gradients():
    """The probe gives the sens in the loss's dtype, as the train cell does (a float32 sens with a float16 loss is a
    type error in MindSpore): at scale 1 the 1e-8 gradient flushes to zero in float16, at 2**14 it is kept."""
    probe, x = GradientProbe(_HalfLoss()), ms.Tensor(np.array([1e-4, 1.0], np.float16))
    at_one, scaled = (unscaled_gradients(probe, (x,), scale)[0] for scale in (1.0, 2.0**14))
    expected = np.array([1e-4, 1.0]) * 1e-4
    assert at_one[0] == 0.0 and at_one[1] == pytest.approx(expected[1], rel=1e-3)
    np.testing.assert_allclose(scaled, expected, rtol=2e-3)
