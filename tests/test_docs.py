"""The documentation's runnable examples run, and the README starts with the two promised commands."""

import importlib
import inspect
import os
import pkgutil
import re
import runpy

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _read(*parts):
    with open(os.path.join(ROOT, *parts), encoding="utf-8") as handle:
        return handle.read()


@pytest.mark.slow
def test_quickstart_model_example_runs(tmp_path, monkeypatch, capsys):
    block = re.findall(r"```python\n(.*?)```", _read("docs", "quickstart.md"), re.S)[0]
    monkeypatch.chdir(tmp_path)
    exec(compile(block, "quickstart.md", "exec"), {})
    out = capsys.readouterr().out
    assert "'acc':" in out and (tmp_path / "steps.csv").exists()


def test_readme_example_runs():
    """The README's example builds its Model (its training is left as a comment there)."""
    (block,) = re.findall(r"```python\n(.*?)```", _read("README.md"), re.S)
    namespace = {}
    exec(compile(block, "README.md", "exec"), namespace)
    assert namespace["manager"].get_loss_scale() == 2.0**24  # MindSpore's default, as its comment says
    assert namespace["model"].train_network.loss_scaling_manager is not None


@pytest.mark.slow
def test_migration_examples_run(tmp_path, capsys):
    """Every lossscale example of the migration guide runs as written and prints what its comments say.

    Each block runs from a file of its own (MindSpore's compiler reads the source of jit functions)."""
    blocks = re.findall(r"```python\n(.*?)```", _read("docs", "migration.md"), re.S)
    assert len(blocks) >= 3
    for index, block in enumerate(blocks):
        path = tmp_path / f"migration_example_{index}.py"
        path.write_text(block, encoding="utf-8")
        runpy.run_path(str(path), run_name="__main__")
        printed = capsys.readouterr().out.split()
        for line in block.splitlines():
            if line.startswith("print(") and "#" in line:
                expected = line.split("#", 1)[1].split()
                assert [printed.pop(0) for _ in expected] == expected, line


def test_readme_starts_with_install_and_run_commands():
    first_block = re.findall(r"```bash\n(.*?)```", _read("README.md"), re.S)[0].splitlines()
    assert first_block[0].startswith('pip install -e ".[demo]" && python -m lossscale train')
    assert first_block[1].startswith('pip install -e ".[test]" && python -m pytest -m "not slow and not reference"')
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
