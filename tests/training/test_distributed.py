"""Two ranks on loopback with msrun: every rank skips together (the slow tier, which CI runs; bounded, no
leftovers). The helpers that launch them are tested in the fast tier."""

import json
import os
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest
from mindspore import Tensor, nn
from nets import TESTS, regression_batches, regression_net

from lossscale import TrainOneStepWithLossScaleCell, get_preset
from lossscale.core.automatic import AutomaticLossScaleRule
from lossscale.core.policy import run
from lossscale.core.rule import advance
from lossscale.demo.msrun import (
    LAUNCHED_MARK,
    inside_msrun,
    launch_environment,
    launched_by_us,
    msrun_command,
    run_msrun,
)

HERE = TESTS
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import dp_worker  # noqa: E402


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("dp")
    command = msrun_command(os.path.join(HERE, "dp_worker.py"), [str(out)], workers=2, log_dir=str(out / "logs"))
    done = run_msrun(command, timeout=170, env=launch_environment(ROOT), cwd=str(out))
    logs = (
        "".join(
            open(os.path.join(out, "logs", f), encoding="utf-8", errors="replace").read()[-3000:]
            for f in sorted(os.listdir(out / "logs"))
        )
        if (out / "logs").exists()
        else ""
    )
    assert done.returncode == 0, done.stdout[-3000:] + logs
    reports = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    weights = {(r, name): np.load(out / f"rank{r}_{name}.npy") for r in (0, 1) for name in dp_worker.RUNS}
    return reports, weights, command


@pytest.mark.slow
def test_both_ranks_skip_the_step_where_only_rank_1_overflowed(two_ranks):
    reports, _, _ = two_ranks
    expected_flags = [i == dp_worker.INJECT_STEP for i in range(dp_worker.STEPS)]
    expected_scales = [s.scale for s in run(dp_worker.manager().policy, expected_flags)]
    for report in reports:
        assert report["size"] == 2
        assert report["inject"]["flags"] == expected_flags
        assert report["inject"]["scales"] == expected_scales
        assert report["inject"]["counters"]["skipped_steps"] == 1


@pytest.mark.slow
def test_a_nonfinite_loss_on_rank_1_only_makes_both_ranks_skip(two_ranks):
    """Gradients finite everywhere: the decision travels only through the all-reduced flag (nan + 0)."""
    reports, weights, _ = two_ranks
    expected_flags = [i == dp_worker.INJECT_STEP for i in range(dp_worker.STEPS)]
    for rank, report in enumerate(reports):
        assert report["loss"]["flags"] == expected_flags
        assert report["loss"]["scales"] == [s.scale for s in run(dp_worker.manager().policy, expected_flags)]
        step = dp_worker.INJECT_STEP
        np.testing.assert_array_equal(weights[(rank, "loss")][step], weights[(rank, "loss")][step - 1])
    np.testing.assert_array_equal(weights[(0, "loss")], weights[(1, "loss")])


@pytest.mark.slow
@pytest.mark.parametrize("run_name", ["loss_torch", "loss_torch_eager", "loss_keras", "minimize_keras"])
def test_a_nonfinite_loss_on_rank_1_only_makes_both_ranks_skip_with_the_functional_front_ends(two_ranks, run_name):
    """GradScaler kept a non-finite loss per rank: rank 1 skipped and backed off while rank 0 applied the step,
    so the ranks' weights and scales diverged for the rest of the run (loss_torch_eager: the same step called from
    Python, whose GradScaler calls run compiled graphs with the flag's all-reduce inside them).
    LossScaleOptimizer.minimize did not reduce the gradients it computed: each rank applied its own (the ranks' y
    differ), and the weights diverged."""
    reports, weights, _ = two_ranks
    expected_flags = [i == dp_worker.INJECT_STEP for i in range(dp_worker.STEPS)]
    for rank, report in enumerate(reports):
        assert report[run_name]["flags"] == expected_flags, rank
        assert report[run_name]["scales"] == [
            s.scale for s in run(get_preset("pytorch", init_scale=2.0**10, growth_interval=2), expected_flags)
        ]
        step = dp_worker.INJECT_STEP
        np.testing.assert_array_equal(weights[(rank, run_name)][step], weights[(rank, run_name)][step - 1])
    np.testing.assert_array_equal(weights[(0, run_name)], weights[(1, run_name)])


@pytest.mark.slow
def test_an_inf_on_rank_1_in_an_accumulation_window_skips_the_window_on_both_ranks(two_ranks):
    """Windows of 2 micro-batches, the gradients reduced once per window: the window flag of rank 1 reaches
    rank 0 through the one all-reduce at the window's end."""
    reports, weights, _ = two_ranks
    step = dp_worker.INJECT_STEP  # the last micro-batch of the window (2, 3)
    for rank, report in enumerate(reports):
        assert report["accumulate"]["flags"] == [i == step for i in range(dp_worker.STEPS)], rank
        assert report["accumulate"]["counters"]["skipped_steps"] == 1 and report["accumulate"]["counters"]["steps"] == 4
        np.testing.assert_array_equal(weights[(rank, "accumulate")][step], weights[(rank, "accumulate")][step - 2])
    np.testing.assert_array_equal(weights[(0, "accumulate")], weights[(1, "accumulate")])
    assert reports[0]["accumulate"] == reports[1]["accumulate"]


@pytest.mark.slow
def test_both_ranks_write_their_batch_norm_statistics_back_on_the_step_only_rank_1_overflowed(two_ranks):
    """Each rank's statistics are its own (plain BatchNorm); the skip is common, so rank 0 gives back its finite
    update of the skipped step too, and rank 1 keeps no inf/nan."""
    reports, weights, _ = two_ranks
    step = dp_worker.INJECT_STEP
    for rank, report in enumerate(reports):
        assert report["batchnorm"]["flags"] == [i == step for i in range(dp_worker.STEPS)]
        statistics = weights[(rank, "batchnorm")]
        assert np.isfinite(statistics).all()
        np.testing.assert_array_equal(statistics[step], statistics[step - 1])
        assert not np.array_equal(statistics[step + 1], statistics[step])
    assert not np.array_equal(weights[(0, "batchnorm")], weights[(1, "batchnorm")])


@pytest.mark.slow
def test_both_ranks_stop_at_the_same_step_when_overflows_on_rank_1_persist(two_ranks):
    """overflow_policy="raise" with max_consecutive_overflows=2 and inf on rank 1 only from INJECT_STEP on: the
    all-reduced flag gives rank 0 the same count, so both ranks raise PersistentOverflowError at the second
    overflowing step, with the same state (a rank stopping alone would leave the other in its next all-reduce)."""
    reports, weights, _ = two_ranks
    first, stop = dp_worker.INJECT_STEP, dp_worker.INJECT_STEP + 1
    for rank, report in enumerate(reports):
        persistent = report["persistent"]
        assert persistent["stopped_at"] == stop, rank
        assert persistent["flags"] == [i == first for i in range(stop)]
        assert persistent["counters"]["skipped_steps"] == 2 and persistent["counters"]["consecutive_overflows"] == 2
        np.testing.assert_array_equal(weights[(rank, "persistent")][first], weights[(rank, "persistent")][first - 1])
    assert reports[0]["persistent"] == reports[1]["persistent"]
    np.testing.assert_array_equal(weights[(0, "persistent")], weights[(1, "persistent")])


@pytest.mark.slow
def test_weights_and_scales_identical_on_every_rank_at_every_step(two_ranks):
    reports, weights, _ = two_ranks
    for run_name in ("inject", "clean"):
        np.testing.assert_array_equal(weights[(0, run_name)], weights[(1, run_name)])
        assert reports[0][run_name] == reports[1][run_name]
    inject = weights[(0, "inject")]
    step = dp_worker.INJECT_STEP
    np.testing.assert_array_equal(inject[step], inject[step - 1])  # the skipped step changed nothing
    assert not np.array_equal(inject[step + 1], inject[step])


@pytest.mark.slow
def test_clean_run_matches_single_process_training_on_the_combined_batch(two_ranks):
    _, weights, _ = two_ranks
    net = regression_net()
    step = TrainOneStepWithLossScaleCell(
        net, nn.Momentum(net.trainable_params(), 0.05, 0.9), dp_worker.manager().get_update_cell()
    )
    single = []
    for x, y in regression_batches(dp_worker.STEPS, batch=dp_worker.GLOBAL_BATCH):
        step(Tensor(x), Tensor(y))
        single.append(np.concatenate([p.asnumpy().ravel() for p in net.trainable_params()]))
    np.testing.assert_allclose(weights[(0, "clean")], np.stack(single), rtol=1e-5, atol=1e-7)


@pytest.mark.slow
def test_no_process_left_behind(two_ranks):
    """No worker of this launch is alive (a launch is told apart by its output folder, the worker's argument:
    under pytest-xdist the other test process may be running its own launch of this module's fixture)."""
    _, _, command = two_ranks
    worker, output = os.path.join(HERE, "dp_worker.py"), command[-1]
    leftovers = [
        p.pid
        for p in psutil.process_iter(["cmdline"])
        if worker in (p.info["cmdline"] or []) and output in (p.info["cmdline"] or [])
    ]
    assert leftovers == []


def _alive(marker):
    """The pids of living processes whose command line holds ``marker`` (a killed orphan is reaped by init: waited
    for, up to 10 s)."""
    for _ in range(100):
        alive = [
            p.pid
            for p in psutil.process_iter(["cmdline", "status"])
            if marker in (p.info["cmdline"] or []) and p.info["status"] != psutil.STATUS_ZOMBIE
        ]
        if not alive:
            return []
        time.sleep(0.1)
    return alive


@pytest.mark.parametrize("launcher_ends", ["by itself", "by its timeout"])
@pytest.mark.slow
def test_run_msrun_kills_what_the_launcher_leaves_behind(tmp_path, launcher_ends):
    """A worker that outlives msrun (a launcher that exits, or one that run_msrun stops at its timeout, without
    waiting for it) is killed with its process group: nothing of a launch survives it."""
    marker = str(tmp_path / "worker")
    worker = [sys.executable, "-c", "import time; time.sleep(120)", marker]
    launcher = (
        f"import subprocess, time; subprocess.Popen({worker!r}, stdout=subprocess.DEVNULL, "
        f"stderr=subprocess.DEVNULL); print('started', flush=True)"
    )
    if launcher_ends == "by its timeout":
        launcher += "; time.sleep(120)"
        started = time.monotonic()
        with pytest.raises(subprocess.TimeoutExpired):
            run_msrun([sys.executable, "-c", launcher], timeout=5)
        assert time.monotonic() - started < 60  # not after the launcher's own 120 s
    else:
        done = run_msrun([sys.executable, "-c", launcher], timeout=60)
        assert done.returncode == 0 and done.stdout.strip() == "started"
    assert _alive(marker) == []


@pytest.mark.slow  # kept long: it is what the test checks (a full run)
def test_cli_trains_the_demo_model_on_two_processes(tmp_path):
    command = [
        sys.executable,
        "-m",
        "lossscale",
        "train",
        "--workers",
        "2",
        "--model",
        "mlp",
        "--epochs",
        "1",
        "--no-progress",
        "--output",
        str(tmp_path),
    ]
    done = run_msrun(command, timeout=170, env=dict(launch_environment(ROOT), **{LAUNCHED_MARK: ""}), cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "rank 0 of 2: per-rank batch 32, global batch 64" in done.stdout
    assert "test accuracy:" in done.stdout
    rows = (tmp_path / "metrics.csv").read_text().strip().splitlines()
    assert len(rows) - 1 == 1438 // 2 // 32  # steps per rank: half of the data per epoch
    leftovers = [p.pid for p in psutil.process_iter(["cmdline"]) if str(tmp_path) in " ".join(p.info["cmdline"] or [])]
    assert leftovers == []


def test_a_child_of_our_launcher_never_launches_again(tmp_path, capsys, monkeypatch):
    from lossscale.demo.cli import main

    monkeypatch.setenv(LAUNCHED_MARK, "1")
    monkeypatch.delenv("MS_ROLE", raising=False)
    assert main(["train", "--workers", "2", "--output", str(tmp_path)]) == 2
    assert "refusing to launch msrun again" in capsys.readouterr().err


def _set_or_unset(monkeypatch, name, value):
    """Set the environment variable ``name`` for this test, or remove it when ``value`` is None."""
    if value is None:
        monkeypatch.delenv(name, raising=False)
    else:
        monkeypatch.setenv(name, value)


@pytest.mark.parametrize("mark, announced", [("1", False), (None, True)])
def test_workers_we_launch_leave_the_replacement_note_to_their_launcher(tmp_path, capsys, monkeypatch, mark, announced):
    """`train --workers N` says which results it replaces before it launches msrun, and prints rank 0's log after
    the run: its workers do not say it again. Under the user's own msrun no launcher has said it."""
    from lossscale.demo.cli import main
    from lossscale.demo.options import CliError

    def stop_before_init():
        raise CliError("stopped before init")

    (tmp_path / "metrics.csv").write_text("")
    _set_or_unset(monkeypatch, LAUNCHED_MARK, mark)
    monkeypatch.setenv("MS_ROLE", "MS_WORKER")
    monkeypatch.setattr("lossscale.demo.msrun.init_data_parallel", stop_before_init)
    assert main(["train", "--workers", "2", "--output", str(tmp_path)]) == 2
    assert ("note: replacing metrics.csv" in capsys.readouterr().err) is announced


@pytest.mark.parametrize(
    "role, inside", [("MS_WORKER", True), ("MS_SCHED", True), ("MS_PSERVER", False), (None, False)]
)
def test_inside_msrun_holds_for_its_workers_and_its_scheduler(monkeypatch, role, inside):
    """msrun's scheduler runs the same script (and waits in init()): it must not take itself for a fresh launch."""
    _set_or_unset(monkeypatch, "MS_ROLE", role)
    assert inside_msrun() is inside


@pytest.mark.parametrize("mark, launched", [("1", True), ("", False), ("0", False), (None, False)])
def test_only_our_mark_says_launched_by_us(monkeypatch, mark, launched):
    """An empty mark is how a child clears it to launch on purpose (the two-process CLI test does)."""
    _set_or_unset(monkeypatch, LAUNCHED_MARK, mark)
    assert launched_by_us() is launched


@pytest.mark.parametrize("pythonpath", [None, "/elsewhere"])
def test_launch_environment_marks_the_child_and_puts_this_python_first(monkeypatch, pythonpath):
    """msrun's workers run `python` from PATH: this interpreter's bin comes first, or they import another Python's
    packages (or none); the package root is prepended to PYTHONPATH, which keeps what was there."""
    monkeypatch.setenv("PATH", "/usr/bin")
    _set_or_unset(monkeypatch, "PYTHONPATH", pythonpath)
    parent = dict(os.environ)
    env = launch_environment("/the/package")
    assert env[LAUNCHED_MARK] == "1"
    assert env["PATH"].split(os.pathsep) == [os.path.dirname(sys.executable), "/usr/bin"]
    assert env["PYTHONPATH"].split(os.pathsep) == ["/the/package"] + ([] if pythonpath is None else [pythonpath])
    assert launch_environment().get("PYTHONPATH") == pythonpath
    assert dict(os.environ) == parent  # the parent's own environment is untouched


@pytest.mark.slow
def test_automatic_loss_scaling_counts_every_rank_s_gradients(two_ranks):
    """Rank 1's own gradients never reach the upper bin: it backs off with rank 0 only through the all-reduced
    counts (alone it would double at every step)."""
    reports, _, _ = two_ranks
    rule = AutomaticLossScaleRule(init_scale=1024.0)
    state, expected = rule.initial_state(), []
    for _ in range(dp_worker.STEPS):
        upper = sum(int(np.sum(x * np.float32(state["scale"]) >= 4094.0)) for x in dp_worker.AUTOMATIC_X)
        state = advance(rule, state, False, (upper, 8))
        expected.append(state["scale"])
    assert expected[:4] == [2048.0, 4096.0, 2048.0, 4096.0]
    assert reports[0]["automatic"]["scales"] == reports[1]["automatic"]["scales"] == expected
