"""Repository-wide pytest setup: MindSpore graph mode on CPU for tests and doctests alike, and a clean tree.

MindSpore writes ``rank_0/om/analyze_fail.ir`` into the working directory whenever a graph fails to compile
(several tests make that happen on purpose); ``MS_OM_PATH`` sends it to a temporary folder instead. At the
end of the session, a file the tests left in the repository fails the run.
"""
import os
import subprocess
import tempfile

os.environ.setdefault("MS_OM_PATH", tempfile.mkdtemp(prefix="lossscale-tests-om-"))

import mindspore as ms  # noqa: E402  (after MS_OM_PATH)

ms.set_context(mode=ms.GRAPH_MODE)
if hasattr(ms, "set_device"):
    ms.set_device("CPU")
else:  # pragma: no cover - MindSpore before set_device
    ms.set_context(device_target="CPU")

ROOT = os.path.dirname(os.path.abspath(__file__))


def _untracked():
    """Files git does not track nor ignore, or None outside a git checkout."""
    try:
        done = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=all"],
                              capture_output=True, text=True, timeout=60, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return {line[3:] for line in done.stdout.splitlines() if line.startswith("??")}


def pytest_sessionstart(session):
    session.config.untracked_before = _untracked()


def pytest_sessionfinish(session, exitstatus):
    if hasattr(session.config, "workerinput"):  # an xdist worker: the controller checks
        return
    before = getattr(session.config, "untracked_before", None)
    after = _untracked()
    if before is None or after is None:
        return
    left = sorted(after - before)
    if left:
        print(f"\nthe tests left files in the repository: {', '.join(left)}")
        session.exitstatus = 1
