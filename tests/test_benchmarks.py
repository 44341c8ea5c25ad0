"""The benchmark harness runs end to end (smoke mode: a few steps of two configurations of the many-tensor model,
one in fp32 and one in fp16; timings are not checked here, and the full run covers every configuration)."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow  # kept long: it is what the test checks (a full run)
def test_benchmark_smoke_run(tmp_path):
    output = tmp_path / "bench.json"
    done = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "benchmarks", "run.py"),
            "--smoke",
            "--models",
            "dense16",
            "--levels",
            "O0",
            "O3",
            "--output",
            str(output),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        env=dict(os.environ, PYTHONPATH=ROOT),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(output.read_text())
    assert {(r["model"], r["level"]) for r in result["steps"]} == {("dense16", "O0"), ("dense16", "O3")}
    scaling = {"lossscale", "gradscaler", "gradscaler_paddle", "keras", "ms_jit"}
    for r in result["steps"]:
        assert set(r["summary"]) == {"plain", "plain_if", "plain_wait", "cheapest", "automatic"} | scaling
        assert all(s["steps"] == 4 and s["median_ms"] > 0 for s in r["summary"].values())
        assert set(r["ratios"]) >= {
            "lossscale/plain",
            "lossscale/plain_if",
            "lossscale/plain_wait",
            "lossscale/ms_jit",
            "gradscaler/ms_jit",
            "automatic/lossscale",
            *(f"{variant}/cheapest" for variant in scaling),
        }
    # both checks agree: finite gradients pass, a nan fails
    assert all(
        c["finite_then_nan"] == {"lossscale": [True, False], "all_finite": [True, False]} for c in result["checks"]
    )
    assert set(result["eager"]["summary"]) == {"plain", "ms_eager", "gradscaler", "gradscaler_unscale", "keras"}
    tables = ("ls/plain", "keras/floor", "automatic/lossscale", "speedup", "eager (PyNative)")
    assert all(table in done.stdout for table in tables)


@pytest.mark.slow
def test_running_statistics_benchmark_smoke_run():
    done = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "benchmarks", "bench_running_statistics.py"),
            "--rounds",
            "1",
            "--steps",
            "1",
            "--builds",
            "1",
            "--levels",
            "O2",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env=dict(os.environ, PYTHONPATH=ROOT),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| O2 |")]
    assert len(rows) == 1 and len(rows[0].split("|")) == 8, done.stdout


@pytest.mark.slow
def test_eager_benchmark_smoke_run():
    done = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "benchmarks", "bench_eager.py"),
            "--rounds",
            "1",
            "--steps",
            "1",
            "--warmup",
            "1",
            "--builds",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env=dict(os.environ, PYTHONPATH=ROOT),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads([line for line in done.stdout.splitlines() if line.startswith("RESULT ")][-1][7:])
    assert set(result["summary"]) == {"plain", "ms_eager", "gradscaler", "gradscaler_unscale", "keras"}
    assert set(result["ratios"]) == {f"{name}/plain" for name in result["summary"] if name != "plain"}
    assert "first call s" in done.stdout


@pytest.mark.reference
def test_torch_benchmark_smoke_run():
    """PyTorch's GradScaler against PyTorch's plain step (skipped without torch)."""
    pytest.importorskip("torch")
    command = [sys.executable, os.path.join(ROOT, "benchmarks", "bench_torch.py"), "--rounds", "2", "--steps", "1"]
    done = subprocess.run([*command, "--warmup", "1"], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads([line for line in done.stdout.splitlines() if line.startswith("RESULT ")][-1][7:])
    assert set(result["median_ms"]) == {"torch_plain", "torch_gradscaler"} and result["gradscaler/plain"] > 0


@pytest.mark.slow
@pytest.mark.parametrize(
    "step, rows",
    [
        (
            "gradscaler",
            [
                "current",
                "- runtime raises",
                "- after-unscale_ branch",
                "- rule in Parameters",
                "- non-finite loss term",
                "- all four",
            ],
        ),
        (
            "train_cell",
            ["current", "- non-finite loss flag", "- overflow counters", "- MindSpore's update cell", "- all three"],
        ),
    ],
)
@pytest.mark.slow
def test_first_call_ladder_smoke_run(step, rows):
    """The knock-out ladder builds every variant (its replacements still fit the code they replace) and prints a
    row each; one build each, against the current code (no git history needed)."""
    done = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "benchmarks", "bench_first_call_ladder.py"),
            "--step",
            step,
            "--rounds",
            "1",
            "--no-release",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env=dict(os.environ, PYTHONPATH=ROOT),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert [line.split("|")[1].strip() for line in done.stdout.splitlines() if line.startswith("| ")][1:] == rows, (
        done.stdout
    )


def test_release_materialise_renames_the_package_and_removes_its_folder_at_exit(tmp_path):
    """``benchmarks/release.py`` gives 0.1.0 as ``lossscale_release`` (its own imports renamed, so it never
    loads the current package) and leaves no temporary folder behind (it left one per benchmark run)."""
    if (
        subprocess.run(
            ["git", "-C", ROOT, "cat-file", "-e", "ed60d3f^{commit}"], capture_output=True, check=False
        ).returncode
        != 0
    ):
        pytest.skip("needs this repository's git history (the 0.1.0 commit)")
    script = (
        "import os, sys; sys.path.insert(0, os.path.join(sys.argv[1], 'benchmarks')); import release; "
        "module = release.materialise(); folder = os.path.dirname(os.path.dirname(module.__file__)); "
        "cls = module.GradScaler; print(folder); "
        "print(sorted(name for name in sys.modules if name.split('.')[0] == 'lossscale')); print(cls.__module__)"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, ROOT],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=dict(os.environ, TMPDIR=str(tmp_path)),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    folder, current_modules, module_of_class = done.stdout.splitlines()[-3:]
    assert os.path.dirname(folder) == str(tmp_path) and os.path.basename(folder).startswith("lossscale_release_")
    assert current_modules == "[]" and module_of_class.startswith("lossscale_release.")
    assert not os.path.exists(folder) and not os.listdir(tmp_path)


def _bench_cpu_kernels():
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    try:
        import bench_cpu_kernels
    finally:
        sys.path.pop(0)
    return bench_cpu_kernels


def test_cpu_kernel_benchmark_alternates_the_settings_in_processes_and_tabulates_their_medians(monkeypatch):
    """bench_cpu_kernels.py (a full run takes 7 minutes, so its processes are stood in for): each process gets
    one setting in its environment, the settings alternate, and the table's numbers are the medians of the
    processes' results, the speed-up their ratio."""
    module = _bench_cpu_kernels()
    calls = []

    def fake_process(script, args, timeout, env=None):
        setting = env["ONEDNN_MAX_CPU_ISA"]
        calls.append((script, args[:2], setting))
        slow = {"DEFAULT": 10.0, "AVX2": 1.0}[setting] * (1 + len(calls))  # each process slower than the last
        return {
            "summary": {"plain": {"median_ms": slow}, "lossscale": {"median_ms": 1.5 * slow}},
            "ratios": {"lossscale/plain": 1.5 if setting == "AVX2" else 1.25},
        }

    monkeypatch.setattr(module, "run_process", fake_process)
    results = module.measure("O2", pairs=2)
    assert calls == [
        ("bench_step.py", ["--model=lenet5", "--level=O2"], setting)
        for setting in ("DEFAULT", "AVX2", "DEFAULT", "AVX2")
    ]
    row = module.table([("O2", results)]).splitlines()[2].split()
    # plain: DEFAULT 20 and 40 ms -> 30; AVX2 3 and 5 ms -> 4; lossscale 1.5x those; ratios 1.25 and 1.5
    assert row == ["O2", "30.00", "ms", "4.00", "ms", "7.5x", "45.00", "ms", "6.00", "ms", "1.250", "1.500"]
