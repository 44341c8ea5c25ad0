"""Repository-wide pytest setup: MindSpore graph mode on CPU for tests and doctests alike, and a clean tree.

MindSpore writes ``rank_0/om/analyze_fail.ir`` into the working directory whenever a graph fails to compile
(several tests make that happen on purpose); ``MS_OM_PATH`` sends it to a temporary folder instead, where
Hypothesis keeps its files too. At the
end of the session, a file the tests left in the repository fails the run (ignored ones too, such as
``rank_*/``, but not caches), and the temporary folder is removed.
"""

import atexit
import os
import shutil
import subprocess
import tempfile

if "MS_OM_PATH" not in os.environ:  # xdist workers inherit the controller's folder
    os.environ["MS_OM_PATH"] = tempfile.mkdtemp(prefix="lossscale-tests-om-")
    atexit.register(shutil.rmtree, os.environ["MS_OM_PATH"], ignore_errors=True)

import mindspore as ms  # noqa: E402  (after MS_OM_PATH)
from hypothesis.configuration import set_hypothesis_home_dir  # noqa: E402

# Hypothesis keeps its example database and its cache of constants in the same temporary folder, not in .hypothesis/.
set_hypothesis_home_dir(os.path.join(os.environ["MS_OM_PATH"], "hypothesis"))

ms.set_context(mode=ms.GRAPH_MODE)
if hasattr(ms, "set_device"):
    ms.set_device("CPU")
else:  # pragma: no cover - MindSpore before set_device
    ms.set_context(device_target="CPU")

ROOT = os.path.dirname(os.path.abspath(__file__))


CACHES = ("__pycache__/", ".pytest_cache/", ".egg-info/")


def _untracked():
    """Files git does not track (ignored ones included, caches not), or None outside a git checkout."""
    try:
        done = subprocess.run(
            ["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=all", "--ignored"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return {
        line[3:]
        for line in done.stdout.splitlines()
        if line[:2] in ("??", "!!") and not any(cache in line for cache in CACHES)
    }


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
