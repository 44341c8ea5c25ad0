"""What the oneDNN limit of the command line, the tests and the benchmarks (lossscale/_cpu_kernels.py) changes.

    python benchmarks/bench_cpu_kernels.py [--levels O0 O2] [--pairs 2]   # about 7 minutes on 2 cores

oneDNN reads ONEDNN_MAX_CPU_ISA once per process, so each setting runs in processes of its own:
benchmarks/bench_step.py on LeNet5 (the only benchmark network with convolutions), alternating oneDNN's own
choice (DEFAULT) and AVX2, ``--pairs`` times per amp level. The table gives the median step time of the plain
step (1) and of lossscale's train cell (2) under each setting, the speed-up of the limit, and the paired ratio
lossscale/plain (measured within each process) under each setting: the faster the convolutions, the more
visible the cost of loss scaling.
"""

import argparse
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from common import LEVELS  # noqa: E402
from run import run_process  # noqa: E402

from lossscale.core.compat import ONEDNN_ISA_VARIABLE  # noqa: E402

SETTINGS = ("DEFAULT", "AVX2")
TIMING = ["--rounds=4", "--steps=10", "--warmup=3", "--builds=1"]


def measure(level, pairs):
    """``{setting: [bench_step payload per process]}`` for LeNet5 at ``level``, the settings alternating."""
    results = {setting: [] for setting in SETTINGS}
    for _ in range(pairs):
        for setting in SETTINGS:
            env = dict(os.environ, **{ONEDNN_ISA_VARIABLE: setting})
            results[setting].append(
                run_process("bench_step.py", ["--model=lenet5", f"--level={level}", *TIMING], timeout=1800, env=env)
            )
    return results


def _median(payloads, read):
    return statistics.median(read(payload) for payload in payloads)


def table(rows):
    header = (
        f"{'level':<7}{'plain DEFAULT':>15}{'plain AVX2':>12}{'speed-up':>10}{'ls DEFAULT':>12}{'ls AVX2':>10}"
        f"{'ls/plain DEFAULT':>18}{'ls/plain AVX2':>15}"
    )
    lines = [header, "-" * len(header)]
    for level, results in rows:
        step = {
            (setting, variant): _median(results[setting], lambda p, v=variant: p["summary"][v]["median_ms"])
            for setting in SETTINGS
            for variant in ("plain", "lossscale")
        }
        ratio = {setting: _median(results[setting], lambda p: p["ratios"]["lossscale/plain"]) for setting in SETTINGS}
        lines.append(
            f"{level:<7}{step['DEFAULT', 'plain']:>12.2f} ms{step['AVX2', 'plain']:>9.2f} ms"
            f"{step['DEFAULT', 'plain'] / step['AVX2', 'plain']:>9.1f}x"
            f"{step['DEFAULT', 'lossscale']:>9.2f} ms{step['AVX2', 'lossscale']:>7.2f} ms"
            f"{ratio['DEFAULT']:>18.3f}{ratio['AVX2']:>15.3f}"
        )
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", nargs="+", choices=LEVELS, default=["O0", "O2"])
    parser.add_argument("--pairs", type=int, default=2, help="processes per setting and level, alternating")
    args = parser.parse_args()
    print(table([(level, measure(level, args.pairs)) for level in args.levels]))


if __name__ == "__main__":
    main()
