"""Command line: ``python -m lossscale {train,compare,inspect}`` (also the ``lossscale`` console script).

- ``train``: train a reference model on the bundled digits data with a chosen precision and
  loss scaling; a progress bar per epoch (loss, scale, skipped steps); the test accuracy and a
  loss-scale summary at the end; ``metrics.csv``, ``summary.json`` and ``training.png`` in the
  output folder. A run whose steps are mostly skipped because of overflow says so on stderr.
- ``compare``: fp32, fp16 without scaling, fp16 with a fixed scale and fp16 with dynamic scaling
  on the same seed and data; a table and ``compare.png``. ``--results PAGE.md`` also writes the
  results page of the documentation (docs/results.md) with its figures.
- ``inspect``: histogram of log2|gradient| against the float16 range, the fraction lost at a
  given scale, and the largest scale without overflow, at the initial weights or along training.

Exit codes: 0 success; 1 training stopped by persistent overflow (``--overflow-policy raise``) or a
``train`` run in which no step was applied (every step overflowed); 2 a usage error, an unavailable
device or an unwritable output folder (one line on stderr).
MindSpore and NumPy are imported only once a command runs, so ``--help`` and ``--version`` are
immediate. Unless the environment sets ``ONEDNN_MAX_CPU_ISA``, a command limits oneDNN's CPU kernels to AVX2: with
MindSpore 2.10 on an AVX-512 CPU, convolutions are then about 25 times faster (:mod:`lossscale.core.compat`).
"""

import importlib
import os
import sys
import warnings

from lossscale.core.compat import prefer_fast_cpu_convolutions
from lossscale.demo.options import (
    EXIT_OK,
    EXIT_STALLED,
    EXIT_USAGE,
    CliError,
    TrainingStalled,
    _check_batch_size,
    _check_model,
    _version,
    build_parser,
)

# Each command's module, imported when the command runs (it imports MindSpore).
COMMANDS = {
    "train": ("lossscale.demo.runs", "command_train"),
    "compare": ("lossscale.demo.compare", "command_compare"),
    "inspect": ("lossscale.demo.inspection", "command_inspect"),
}


def _command(name):
    """The function of command ``name``; its module imported now (a CliError if the demo's extra is missing)."""
    module, function = COMMANDS[name]
    try:
        return getattr(importlib.import_module(module), function)
    except ModuleNotFoundError as error:
        if error.name != "tqdm":
            raise
        raise CliError('the demo needs tqdm, which is not installed: pip install "lossscale[demo]"') from None


def _set_device(device):
    """Select ``device`` in MindSpore, or raise CliError if this MindSpore cannot use it."""
    import mindspore as ms  # a command runs: MindSpore is needed from here on

    ms.set_context(mode=ms.GRAPH_MODE)
    if device is None:
        return
    available = getattr(getattr(ms, "hal", None), "is_available", None)
    if available is not None and not available(device):
        supported = [name for name in ("CPU", "GPU", "Ascend") if available(name)]
        raise CliError(
            f"--device {device} is not available: this MindSpore installation can use "
            f"{', '.join(supported) or 'no device'}"
        )
    try:
        if hasattr(ms, "set_device"):
            ms.set_device(device)
        else:  # pragma: no cover - MindSpore before set_device
            ms.set_context(device_target=device)
    except (RuntimeError, ValueError) as error:
        raise CliError(f"--device {device} is not available: {str(error).splitlines()[0]}") from None


def _quiet_mindspore():
    """MindSpore's own warnings off unless GLOG_v says otherwise: deprecations of kernels we do not call, such as
    the FusedSparseAdam that MindSpore 2.10's nn.Adam builds. MindSpore reads GLOG_v when it logs for the first
    time (importing it may), so this must run before MindSpore is imported; in a process that imported it
    already, it changes nothing."""
    os.environ.setdefault("GLOG_v", "3")


def _show_warning(message, category, filename, lineno, file=None, line=None):
    """Warnings during a command as one line each, without the source location, advising the command line's
    options (a command runs, so MindSpore is imported already)."""
    from lossscale.demo.runs import command_line_advice

    print(f"lossscale: warning: {command_line_advice(str(message))}", file=sys.stderr)


def main(argv=None):
    """Entry point; returns the process exit code (see the module docstring)."""
    try:
        _quiet_mindspore()  # before anything imports MindSpore (the batch-size check does): it reads GLOG_v once
        prefer_fast_cpu_convolutions()  # before MindSpore's first CPU operation
        parser = build_parser()
        if argv is None:
            argv = sys.argv[1:]
        if argv[:1] == ["--version"]:
            print(_version())
            return EXIT_OK
        args = parser.parse_args(argv)
        args.argv = list(argv)
        _check_model(args.model)
        _check_batch_size(args.batch_size, getattr(args, "workers", 1))
        _set_device(args.device)
        with warnings.catch_warnings():
            warnings.showwarning = _show_warning
            return _command(args.command)(args)
    except CliError as error:
        print(f"lossscale: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except TrainingStalled as error:
        print(f"lossscale: training stopped: {error}", file=sys.stderr)
        return EXIT_STALLED
