"""The documentation's runnable examples run, and the README starts with the two promised commands."""

import importlib
import inspect
import os
import pkgutil
import re
import subprocess
import sys

import pytest

from lossscale.demo.msrun import msrun_command

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _read(*parts):
    with open(os.path.join(ROOT, *parts), encoding="utf-8") as handle:
        return handle.read()


MSRUN = "# run with: msrun"  # the first line of an example that runs on 2 ranks (data parallel)


def _python_blocks():
    """Every Python block of README.md and docs/*.md, as pytest params (each a fresh process: the slow tier)."""
    pages = ["README.md"] + sorted(
        f"docs/{name}" for name in os.listdir(os.path.join(ROOT, "docs")) if name.endswith(".md")
    )
    for page in pages:
        for index, code in enumerate(re.findall(r"```python\n(.*?)```", _read(page), re.S)):
            yield pytest.param(code, id=f"{page}:{index + 1}", marks=pytest.mark.slow)


def _printed_lines(code):
    """What the example says it prints: the comment of each top-level ``print(...)  # output`` line."""
    return [line.split("#", 1)[1].strip() for line in code.splitlines() if line.startswith("print(") and "#" in line]


def _run_example(code, folder):
    """Run ``code`` from a file of its own in ``folder`` (MindSpore's compiler reads the source of jit functions),
    in a fresh process; return what it printed (rank 0's, for a data-parallel example)."""
    path = folder / "example.py"
    path.write_text(code, encoding="utf-8")
    if code.startswith(MSRUN):
        command = msrun_command(str(path), workers=2, log_dir=str(folder / "logs"))
    else:
        command = [sys.executable, str(path)]
    done = subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    if code.startswith(MSRUN):
        return (folder / "logs" / "worker_0.log").read_text(encoding="utf-8")
    # MindSpore's log for an unused output of value_and_grad inside a compiled function (with or without loss
    # scaling): it reads like the dropped update() the docs warn about, so no example leaves one.
    assert "Some side effect nodes were eliminated" not in done.stderr, done.stderr[-3000:]
    return done.stdout


@pytest.mark.parametrize("code", _python_blocks())
def test_every_python_block_runs_as_written(code, tmp_path):
    """Each example runs as written in an empty folder and prints what its comments say, in that order."""
    printed = [line.strip() for line in _run_example(code, tmp_path).splitlines()]
    position = 0
    for expected in _printed_lines(code):
        assert expected in printed[position:], (expected, printed[-20:])
        position = printed.index(expected, position) + 1


def test_the_design_shows_the_user_rule_the_tests_run():
    """docs/design.md's own rule is tests/user_rule.py's, which tests/test_user_rule.py runs everywhere."""
    from user_rule import QuarterOnRepeat

    assert inspect.getsource(QuarterOnRepeat) in _read("docs", "design.md")


def test_readme_starts_with_install_and_run_commands():
    first_block = re.findall(r"```bash\n(.*?)```", _read("README.md"), re.S)[0].splitlines()
    assert first_block[0].startswith("python -m venv .venv && . .venv/bin/activate")
    assert first_block[1].startswith('pip install -e ".[demo]" && python -m lossscale train')
    assert first_block[2].startswith('pip install -e ".[test]" && python -m pytest -m "not slow and not reference"')
    ci = _read(".ci", "run")
    assert 'pip install -q -e ".[test]"' in ci and 'python -m pytest -q -m "$FAST"' in ci
    assert "FAST='not slow and not reference'" in ci  # the README's command, which CI runs as it is
    assert 'python -m pytest -q -m "slow or reference"' in ci  # and the rest


def test_every_public_name_is_documented():
    import lossscale

    api = _read("docs", "api.md")
    for name in lossscale.__all__:
        assert f"`{name}" in api, name
        obj = getattr(lossscale, name)
        if callable(obj):  # classes and functions carry an example; constants are described in api.md
            assert obj.__doc__ and ">>>" in obj.__doc__, name


# Named in api.md with a call but not lossscale's: MindSpore's and Python's names, and call examples.
_FOREIGN_CALLS = {
    "EmbeddingLookup",
    "RuntimeError",
    "get_lr",
    "super",
    "cell",
    "opt",
    "before_backward",
}  # an attribute each check object sets in __init__


def _package_names(package):
    """Every name defined in ``package``'s modules (its sub-packages' too), and every attribute of their classes."""
    names = set()
    for module_info in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
        module = importlib.import_module(module_info.name)
        for name, value in vars(module).items():
            names.add(name)
            if inspect.isclass(value):
                names.update(dir(value))
    return names


def test_every_call_api_md_names_exists():
    """api.md names functions and methods as `name(...)`: each must exist (it named a method that had gone)."""
    import lossscale
    import lossscale_models

    names = _package_names(lossscale) | _package_names(lossscale_models) | _FOREIGN_CALLS
    called = set(re.findall(r"`(?:[A-Za-z_][\w.]*\.)?([A-Za-z_]\w*)\(", _read("docs", "api.md")))
    assert len(called) > 100
    assert sorted(called - names) == []
