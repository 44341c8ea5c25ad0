"""Launching data-parallel training with MindSpore's own launcher, ``msrun``, on one machine.

Facts this module relies on (MindSpore 2.10, measured on CPU):

- ``msrun --worker_num=N --local_worker_num=N --master_addr=127.0.0.1 --master_port=P
  --join=True script.py`` starts N workers with the ``MS_ROLE``/``MS_WORKER_NUM``/... environment
  variables set; the Python environment's ``bin`` must be first on ``PATH`` or the workers
  cannot import mindspore.
- CPU AllReduce supports only SUM on float32/float16, so the overflow flag is sent as a
  float32 and compared with 0 (see :class:`lossscale.TrainOneStepWithLossScaleCell`).
- ``get_auto_parallel_context("device_num")`` is 1 under msrun: the group size comes from
  ``mindspore.communication.get_group_size()`` (MindSpore's gradient reducer does that too).
"""

import os
import shutil
import signal
import socket
import subprocess
import sys

LAUNCHED_MARK = "LOSSSCALE_MSRUN_CHILD"


def inside_msrun():
    """True in a process started by msrun: a worker (``MS_ROLE=MS_WORKER``) or the scheduler
    (``MS_ROLE=MS_SCHED``), which runs the same script and stays inside ``init()`` until the end."""
    return os.environ.get("MS_ROLE") in ("MS_WORKER", "MS_SCHED")


def launched_by_us():
    """True in a child of :func:`run_msrun` (which must never launch msrun again)."""
    return os.environ.get(LAUNCHED_MARK) == "1"


def init_data_parallel():
    """In an msrun worker: initialise communication and data parallelism; return ``(rank, group_size)``.

    Gradients are averaged over the group (``gradients_mean=True``), so N ranks with
    per-rank batch B train like one process with batch N*B.
    """
    import mindspore as ms
    from mindspore.communication import get_group_size, get_rank, init

    init()
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
    return get_rank(), get_group_size()


def free_port():
    """A TCP port on 127.0.0.1 that is free right now.

    Example:
        >>> 1024 <= free_port() <= 65535
        True
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def msrun_command(script, args=(), workers=2, port=None, log_dir="msrun_logs"):
    """The ``msrun`` command line that starts ``workers`` local processes running ``script args``.

    Example:
        >>> cmd = msrun_command("train.py", ["--epochs", "1"], workers=2, port=8118, log_dir="logs")
        >>> cmd[1:6]
        ['--worker_num=2', '--local_worker_num=2', '--master_addr=127.0.0.1', '--master_port=8118', '--join=True']
    """
    bin_dir = os.path.dirname(sys.executable)
    msrun = os.path.join(bin_dir, "msrun")
    if not os.path.exists(msrun):
        msrun = shutil.which("msrun") or "msrun"
    return [
        msrun,
        f"--worker_num={workers}",
        f"--local_worker_num={workers}",
        "--master_addr=127.0.0.1",
        f"--master_port={port or free_port()}",
        "--join=True",
        f"--log_dir={log_dir}",
        script,
        *args,
    ]


def launch_environment(extra_pythonpath=None):
    """The environment for msrun: this interpreter's bin first on PATH (workers import mindspore)."""
    env = dict(os.environ)
    env[LAUNCHED_MARK] = "1"
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    if extra_pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (extra_pythonpath, env.get("PYTHONPATH")) if p)
    return env


def run_msrun(command, timeout, env=None, cwd=None):
    """Run ``command`` in its own process group; on timeout kill the whole group (no stray workers).

    Returns the ``subprocess.CompletedProcess``; raises ``subprocess.TimeoutExpired`` after killing.
    """
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=cwd, start_new_session=True
    )
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)  # anything the launcher left behind
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(command, process.returncode, output, None)
