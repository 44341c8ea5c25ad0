"""Run the whole benchmark suite: one process per configuration, tables, targets, JSON.

    python benchmarks/run.py                 # full run: 3 models at O0 and O2 (about 10 minutes on 2 cores)
    python benchmarks/run.py --smoke         # a few steps per variant: checks the harness, not the speed
    python benchmarks/run.py --no-release    # without the lossscale 0.1.0 comparison (no git history)
    python benchmarks/run.py --output results.json

It also runs bench_eager.py once (the functional front-ends called from Python, MLP O0 in PyNative).

Targets, checked on the full run only (docs/performance.md, "Targets"):
  - every loss-scaling front-end (train cell, both compiled GradScaler spellings, LossScaleOptimizer) at most 1.10x
    the cheapest exact step (bench_step.py's `cheapest`), and the compiled front-ends at or below ms_jit;
  - paired ratio lossscale/plain_if <= 1.05 and lossscale/plain <= 1.05;
  - lossscale faster than MindSpore's jit path (ms_jit) on every configuration;
  - our check >= 3x faster than mindspore.amp.all_finite on the MLP gradients, float32 and float16;
  - first call of lossscale <= 1.3x the first call of plain.
"""

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_step import FRONT_ENDS, SCALING  # noqa: E402
from common import LEVELS, MODELS  # noqa: E402

FULL = {"rounds": 10, "steps": 20, "warmup": 10}
SMOKE = {"rounds": 2, "steps": 2, "warmup": 1}
BUILDS = {"full": 3, "smoke": 1}  # fresh builds per variant for the first-call median
EAGER_FULL = {"rounds": 8, "steps": 10, "warmup": 3, "builds": 3}
EAGER_SMOKE = {"rounds": 1, "steps": 1, "warmup": 1, "builds": 1}


def run_process(script, args, timeout, env=None):
    """Run a benchmark script in a fresh process (with ``env``, else this one's) and return its RESULT payload."""
    command = [sys.executable, os.path.join(HERE, script), *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False, env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


def _timing_args(settings):
    return [f"--{key}={value}" for key, value in settings.items()]


def _time_cells(result, variants):
    """``median ± IQR`` step-time cells of ``variants`` (16 characters each)."""
    return "".join(
        f"{result['summary'][v]['median_ms']:>9.2f} ±{result['summary'][v]['iqr_ms']:>5.2f}" for v in variants
    )


def step_table(results):
    header = (
        f"{'config':<12}{'plain':>16}{'plain_if':>16}{'plain_wait':>16}{'lossscale':>16}{'ms_jit':>16}"
        f"{'ls/plain':>10}{'ls/if':>8}{'ls/wait':>9}{'ls/jit':>8}{'1st call ls/plain':>19}"
    )
    lines = [header, "-" * len(header)]
    for r in results:
        cells = _time_cells(r, ("plain", "plain_if", "plain_wait", "lossscale", "ms_jit"))
        ratios = r["ratios"]
        lines.append(
            f"{r['model'] + ' ' + r['level']:<12}{cells}{ratios['lossscale/plain']:>10.3f}"
            f"{ratios['lossscale/plain_if']:>8.3f}{ratios['lossscale/plain_wait']:>9.3f}"
            f"{ratios['lossscale/ms_jit']:>8.3f}"
            f"{r['first_call_ratio']:>19.2f}"
        )
    lines.append("step times: median ± interquartile range in ms; ratios: median over rounds of paired ratios")
    return "\n".join(lines)


def floor_table(results):
    """Every loss-scaling variant's paired step ratio to the cheapest exact step and to MindSpore's amp path."""
    header = f"{'config':<14}{'cheapest ms':>13}" + "".join(f"{v + '/floor':>25}" for v in SCALING)
    header += "".join(f"{v + '/ms_jit':>26}" for v in FRONT_ENDS) + f"{'automatic/lossscale':>22}"
    lines = [header, "-" * len(header)]
    for r in results:
        q = r["ratios"]
        row = f"{r['model'] + ' ' + r['level']:<14}{r['summary']['cheapest']['median_ms']:>13.2f}"
        row += "".join(f"{q[f'{v}/cheapest']:>25.3f}" for v in SCALING)
        row += "".join(f"{q[f'{v}/ms_jit']:>26.3f}" for v in FRONT_ENDS)
        lines.append(row + f"{q['automatic/lossscale']:>22.3f}")
    lines.append("floor: the cheapest exact step (value_and_grad of loss * S, the exact check, unscale, `if`)")
    return "\n".join(lines)


def redesign_table(results):
    """The current code against lossscale 0.1.0 (benchmarks/release.py), in the same processes."""
    header = (
        f"{'config':<12}{'lossscale':>16}{'0.1.0':>16}{'step':>8}{'1st call':>10}"
        f"{'GradScaler':>16}{'0.1.0':>16}{'step':>8}{'1st call':>10}{'GS/ms_jit':>11}"
    )
    lines = [header, "-" * len(header)]
    for r in results:
        q = r["ratios"]
        cells, grad = _time_cells(r, ("lossscale", "release")), _time_cells(r, ("gradscaler", "gradscaler_release"))
        lines.append(
            f"{r['model'] + ' ' + r['level']:<12}{cells}{q['lossscale/release']:>8.3f}"
            f"{r['first_call_vs_release']:>10.2f}{grad}{q['gradscaler/gradscaler_release']:>8.3f}"
            f"{r['gradscaler_first_call_vs_release']:>10.2f}{q['gradscaler/ms_jit']:>11.3f}"
        )
    lines.append(
        "current / 0.1.0: paired step ratio (median over rounds) and first-call ratio (medians of fresh builds)"
    )
    return "\n".join(lines)


def eager_table(eager):
    """bench_eager.py's variants: step time, paired ratio to plain (and to the earlier release), first call."""
    header = f"{'eager (PyNative), mlp O0':<28}{'step':>16}{'/plain':>8}{'/0.1.0':>8}{'1st call s':>12}"
    lines = [header, "-" * len(header)]
    for name in eager["summary"]:
        if name.endswith("_release"):
            continue
        release = eager["ratios"].get(f"{name}/{name}_release")
        lines.append(
            f"{name:<28}{_time_cells(eager, (name,))}{eager['ratios'].get(f'{name}/plain', 1.0):>8.3f}"
            f"{'' if release is None else f'{release:.3f}':>8}{eager['first_call_s'][name]:>12.2f}"
        )
    return "\n".join(lines)


def check_table(checks):
    header = f"{'gradients':<18}{'lossscale ms':>14}{'all_finite ms':>15}{'speedup':>9}"
    lines = [header, "-" * len(header)]
    for c in checks:
        lines.append(
            f"{c['model'] + ' ' + c['dtype']:<18}{c['summary']['lossscale']['median_ms']:>14.3f}"
            f"{c['summary']['all_finite']['median_ms']:>15.3f}{c['speedup']:>8.1f}x"
        )
    return "\n".join(lines)


def verdicts(steps, checks):
    """Each target with its measured value and whether it is met."""
    rows = []
    for r in steps:
        name = f"{r['model']} {r['level']}"
        for variant in FRONT_ENDS:
            floor, jit = r["ratios"][f"{variant}/cheapest"], r["ratios"][f"{variant}/ms_jit"]
            rows.append((f"{name}: {variant}/cheapest <= 1.10", floor, floor <= 1.10))
            if variant != "lossscale":
                rows.append((f"{name}: {variant}/ms_jit <= 1.0", jit, jit <= 1.0))
        rows.append(
            (
                f"{name}: lossscale/plain_if <= 1.05",
                r["ratios"]["lossscale/plain_if"],
                r["ratios"]["lossscale/plain_if"] <= 1.05,
            )
        )
        rows.append(
            (f"{name}: lossscale/plain <= 1.05", r["ratios"]["lossscale/plain"], r["ratios"]["lossscale/plain"] <= 1.05)
        )
        rows.append(
            (
                f"{name}: lossscale faster than ms_jit",
                r["ratios"]["lossscale/ms_jit"],
                r["ratios"]["lossscale/ms_jit"] < 1.0,
            )
        )
        rows.append((f"{name}: first call <= 1.3x plain", r["first_call_ratio"], r["first_call_ratio"] <= 1.3))
        automatic = r["ratios"]["automatic/lossscale"]
        rows.append((f"{name}: automatic loss scaling / the dynamic rule <= 1.03", automatic, automatic <= 1.03))
    for c in checks:
        if c["model"] == "mlp":
            rows.append((f"check vs all_finite, mlp {c['dtype']} >= 3x", c["speedup"], c["speedup"] >= 3.0))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="a few steps only (CI): the harness, not the speed")
    parser.add_argument("--output", default=os.path.join(HERE, "results.json"))
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--levels", nargs="+", default=["O0", "O2"], choices=list(LEVELS))
    parser.add_argument(
        "--no-release",
        action="store_true",
        help="skip the comparison with lossscale 0.1.0 (always skipped with --smoke)",
    )
    args = parser.parse_args()
    release = [] if args.smoke or args.no_release else ["--release"]
    settings = SMOKE if args.smoke else FULL
    timeout = 300 if args.smoke else 900
    start = time.time()
    checks = run_process("bench_check.py", _timing_args(settings), timeout)["checks"]
    steps = []
    for model in args.models:
        for level in args.levels:
            print(f"... {model} {level}", file=sys.stderr, flush=True)
            builds = BUILDS["smoke" if args.smoke else "full"]
            steps.append(
                run_process(
                    "bench_step.py",
                    ["--model", model, "--level", level, f"--builds={builds}", *release, *_timing_args(settings)],
                    timeout,
                )
            )
    print("... eager front-ends (mlp O0, PyNative)", file=sys.stderr, flush=True)
    eager_settings = EAGER_SMOKE if args.smoke else EAGER_FULL
    eager = run_process("bench_eager.py", [*release, *_timing_args(eager_settings)], timeout)
    print(step_table(steps))
    print()
    print(floor_table(steps))
    print()
    if release:
        print(redesign_table(steps))
        print()
    print(eager_table(eager))
    print()
    print(check_table(checks))
    rows = verdicts(steps, checks)
    if not args.smoke:
        print()
        for text, value, met in rows:
            print(f"{'MET ' if met else 'MISS'}  {text}: {value:.3f}")
        print(f"{sum(m for _, _, m in rows)}/{len(rows)} targets met")
    payload = {
        "settings": settings,
        "smoke": args.smoke,
        "seconds": time.time() - start,
        "steps": steps,
        "eager": eager,
        "checks": checks,
        "targets": [{"target": t, "value": v, "met": m} for t, v, m in rows],
    }
    with open(args.output, "w", encoding="utf-8") as handle:
        json.dump(payload, handle, indent=2)
    print(f"\n{len(steps)} configurations in {time.time() - start:.0f} s; JSON: {args.output}")


if __name__ == "__main__":
    main()
