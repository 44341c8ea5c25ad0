"""An earlier release of lossscale, importable next to the current one as ``lossscale_release``.

``materialise(ref)`` extracts ``lossscale/`` at git revision ``ref`` of this repository into a
temporary folder, renames the package (and its own imports) to ``lossscale_release`` and puts the
folder on ``sys.path``, so one process can build and time both versions side by side. The folder
is removed when the process exits. The default revision is the 0.1.0 release, the last before the
core/front-end redesign.
"""

import atexit
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile

RELEASE_0_1_0 = "ed60d3f"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def materialise(ref=RELEASE_0_1_0):
    """Make ``import lossscale_release`` give lossscale at ``ref``; return the module (or raise RuntimeError)."""
    if "lossscale_release" in sys.modules:
        return sys.modules["lossscale_release"]
    try:
        archive = subprocess.run(
            ["git", "-C", ROOT, "archive", "--format=tar", ref, "lossscale"], capture_output=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError) as error:
        raise RuntimeError(f"cannot extract lossscale at {ref!r} with git: {error}") from None
    folder = tempfile.mkdtemp(prefix="lossscale_release_")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    package = os.path.join(folder, "lossscale_release")
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        for member in tar.getmembers():
            if member.isfile() and member.name.endswith(".py"):
                source = tar.extractfile(member).read().decode("utf-8")
                source = re.sub(r"\blossscale(?=[ .\n])", "lossscale_release", source)
                target = os.path.join(package, os.path.relpath(member.name, "lossscale"))
                os.makedirs(os.path.dirname(target), exist_ok=True)
                with open(target, "w", encoding="utf-8") as handle:
                    handle.write(source)
    sys.path.insert(0, folder)
    import lossscale_release

    return lossscale_release
