"""How fast the command line answers ``--help`` and ``--version`` (MindSpore is imported only to train).

    python benchmarks/cli_startup.py [--runs 7]

Each command runs in a fresh process ``--runs`` times; the table gives the median and the slowest
wall time, and ``import mindspore`` alone for comparison. The target is well under a second.
"""

import argparse
import statistics
import subprocess
import sys
import time

COMMANDS = [["--help"], ["train", "--help"], ["compare", "--help"], ["inspect", "--help"], ["--version"]]
TARGET_SECONDS = 1.0


def seconds(arguments, runs):
    """Wall times of ``runs`` fresh processes running ``arguments``."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(arguments, capture_output=True, check=True)
        times.append(time.perf_counter() - start)
    return times


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    rows = [
        (" ".join(["lossscale", *command]), seconds([sys.executable, "-m", "lossscale", *command], args.runs))
        for command in COMMANDS
    ]
    rows.append(("python -c 'import mindspore'", seconds([sys.executable, "-c", "import mindspore"], args.runs)))
    width = max(len(name) for name, _ in rows)
    print(f"{'command':<{width}}  {'median s':>9}  {'max s':>7}")
    for name, times in rows:
        print(f"{name:<{width}}  {statistics.median(times):>9.3f}  {max(times):>7.3f}")
    slowest = max(max(times) for name, times in rows[:-1])
    print(
        f"{'MET' if slowest < TARGET_SECONDS else 'MISS'}  every --help/--version under {TARGET_SECONDS:g} s: "
        f"slowest {slowest:.3f} s"
    )


if __name__ == "__main__":
    main()
