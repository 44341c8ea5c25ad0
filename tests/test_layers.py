"""The package's layers (docs/design.md): what each may import, no import cycle, and the demo apart.

Read from the source with ``ast``, function-level imports included: a layer never imports a higher one, even
lazily, so no import hides a cycle.
"""

import ast
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "lossscale")
# What each part of the package may import of lossscale (itself included).
ALLOWED = {
    "core": {"core"},
    "training": {"core", "training"},
    "frontends": {"core", "frontends"},
    "ports": {"frontends"},  # lossscale/torch.py, paddle.py, keras.py
    "demo": {"core", "training", "frontends", "ports", "demo", "top"},
    "top": {"top"},  # lossscale/__init__.py names its modules as strings, imported on first use
}
PORTS = ("torch", "paddle", "keras")


def _modules():
    """``{dotted name: path}`` of every module of the package."""
    found = {}
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                parts = os.path.relpath(path, ROOT)[:-3].split(os.sep)
                found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _part(module):
    """The layer of a dotted module name of the package."""
    parts = module.split(".")
    if len(parts) == 1 or parts[1] in ("__main__",):
        return "top" if len(parts) == 1 else "demo"
    if parts[1] in PORTS and len(parts) == 2:
        return "ports"
    return parts[1]


def _imports(path):
    """The lossscale modules ``path`` imports, at any level of the file."""
    with open(path, encoding="utf-8") as handle:
        tree = ast.parse(handle.read())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.split(".")[0] == "lossscale")
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "lossscale":
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    modules = _modules()
    return {name for name in found if name in modules}


@pytest.mark.parametrize("module", sorted(_modules()))
def test_each_module_imports_only_its_own_and_lower_layers(module):
    part = _part(module)
    wrong = sorted(name for name in _imports(_modules()[module]) if _part(name) not in ALLOWED[part] | {part})
    assert wrong == [], f"{module} ({part}) imports {wrong}"


def test_no_import_cycle():
    modules = _modules()
    graph = {name: _imports(path) - {name} for name, path in modules.items()}
    for package in (name for name, path in modules.items() if path.endswith("__init__.py")):
        graph[package] = {child for child in graph[package] if not child.startswith(package + ".")}
    state = {}

    def visit(name, trail):
        if state.get(name) == "done":
            return
        assert state.get(name) != "open", f"import cycle: {' -> '.join(trail + [name])}"
        state[name] = "open"
        for child in sorted(graph[name]):
            visit(child, trail + [name])
        state[name] = "done"

    for name in sorted(graph):
        visit(name, [])


def test_the_library_loads_neither_the_demo_nor_its_dependencies():
    """``import lossscale``, every public name and the ports load no demo module, nor tqdm or matplotlib beyond what
    MindSpore itself loads (it imports tqdm when it is installed)."""
    code = (
        "import sys, mindspore\n"
        "before = set(sys.modules)\n"
        "import lossscale\n"
        "for name in lossscale.__all__: getattr(lossscale, name)\n"
        "import lossscale.torch, lossscale.paddle, lossscale.keras\n"
        "print(sorted(m for m in set(sys.modules) - before\n"
        "             if m.startswith(('lossscale.demo', 'lossscale_models', 'tqdm', 'matplotlib'))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True, cwd=ROOT
    )
    assert done.stdout.strip().splitlines()[-1] == "[]"
