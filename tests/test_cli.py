"""The command line: 1-epoch runs of train/compare/inspect, their files, and one-line errors with exit code 2."""
import csv
import json
import os
import subprocess
import sys

import pytest

from lossscale.cli import main, parse_loss_scale, CliError

TINY = ["--model", "mlp", "--epochs", "1", "--batch-size", "128", "--no-progress"]


def _one_error_line(capsys, pattern):
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("lossscale: error: "), err
    assert pattern in err[0]


def test_train_writes_metrics_summary_and_plot(tmp_path, capsys):
    assert main(["train", *TINY, "--output", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "test accuracy:" in out and "loss scaling:" in out and "skipped" in out
    with open(tmp_path / "metrics.csv", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 1438 // 128
    assert [int(r["step"]) for r in rows] == list(range(1, len(rows) + 1))
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["summary"]["steps"] == len(rows)
    assert summary["config"]["loss_scale"] == "dynamic" and 0.0 <= summary["test_accuracy"] <= 1.0
    assert summary["summary"]["skipped_steps"] == sum(r["overflow"] == "True" for r in rows)
    assert (tmp_path / "training.png").stat().st_size > 10_000


def test_train_shows_a_progress_bar_with_scale_and_skips(tmp_path, capsys):
    assert main(["train", "--model", "mlp", "--epochs", "1", "--batch-size", "256", "--output", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert "epoch 1/1" in err and "scale=" in err and "skipped=" in err


def test_train_without_matplotlib_says_so_in_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert main(["train", *TINY, "--loss-scale", "fixed:128", "--output", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "plot: matplotlib is not installed" in out and "Traceback" not in out
    assert not (tmp_path / "training.png").exists() and (tmp_path / "metrics.csv").exists()


@pytest.mark.parametrize("arguments, pattern", [
    (["train", "--model", "vgg"], "unknown model 'vgg'"),
    (["train", "--loss-scale", "fixed:abc"], "fixed:S needs a finite number S >= 1, but got 'abc'"),
    (["train", "--loss-scale", "fixed:0.5"], "but got '0.5'"),
    (["train", "--loss-scale", "auto"], "'none', 'fixed:S', 'dynamic' or 'preset:NAME'"),
    (["train", "--loss-scale", "preset:tensorflow"], "unknown preset 'tensorflow'"),
    (["train", "--epochs", "0"], "--epochs"),
    (["train", "--precision", "fp8"], "--precision"),
    (["compare", "--model", "vgg"], "unknown model"),
    (["inspect", "--scale", "0"], "--scale must be a finite number > 0"),
    (["fly"], "invalid choice"),
])
def test_bad_arguments_give_one_line_and_exit_2(arguments, pattern, capsys, tmp_path):
    assert main([*arguments, "--output", str(tmp_path)] if arguments != ["fly"] else arguments) == 2
    _one_error_line(capsys, pattern)


def test_unwritable_output_folder(tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    assert main(["train", *TINY, "--output", str(blocker / "sub")]) == 2
    _one_error_line(capsys, "cannot write to output folder")


def test_compare_prints_the_table_and_saves_files(tmp_path, capsys):
    assert main(["compare", *TINY, "--loss-weight", "1e-4", "--output", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    table = out[out.index("run "):].splitlines()
    assert [line.split()[0] for line in table[2:6]] == ["fp32", "fp16", "fp16", "fp16"]
    assert "dynamic scaling vs fp32" in out
    results = json.loads((tmp_path / "compare.json").read_text())
    assert results["fp32"]["gradient_lost_fraction"] == 0.0
    # With a 1e-4 loss weight, fp16 without scaling loses gradient elements and dynamic scaling does not.
    assert results["fp16 no scaling"]["gradient_lost_fraction"] > 0.05
    assert results["fp16 dynamic"]["gradient_lost_fraction"] < results["fp16 no scaling"]["gradient_lost_fraction"]
    assert (tmp_path / "compare.png").exists() and (tmp_path / "compare.txt").exists()


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
    assert "largest safe static scale" in capsys.readouterr().out


def test_train_with_a_preset(tmp_path, capsys):
    assert main(["train", *TINY, "--loss-scale", "preset:megatron", "--output", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["config"]["loss_scale"] == "preset:megatron"
    assert summary["summary"]["max_loss_scale"] <= 2.0**32


def test_parse_loss_scale():
    assert parse_loss_scale("none")[1]().get_drop_overflow_update() is False
    label, factory = parse_loss_scale("dynamic", scale_window=7)
    assert label == "dynamic" and factory().scale_window == 7
    with pytest.raises(CliError):
        parse_loss_scale("fixed:inf")


def test_console_script_and_module_entry_points():
    from importlib.metadata import entry_points

    scripts = {e.name: e.value for e in entry_points(group="console_scripts")}
    assert scripts.get("lossscale") == "lossscale.__main__:main"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-m", "lossscale", "train", "--help"], capture_output=True, text=True,
                          timeout=120, check=False, cwd=root, env=dict(os.environ, PYTHONPATH=root))
    assert done.returncode == 0 and "--loss-scale" in done.stdout
