"""The package's layers, bottom to top: every module imports only from its own layer or the ones below, no two modules
import each other (directly or around a circle), and imports sit at the top of a module; an import inside a function
is allowed only for a package that is optional or slow to import, with a comment on its line or the line above
saying so. Read from the source (every import statement, wherever it is), not from what happens to be imported."""
import ast
from pathlib import Path

import pytest

from support.processes import REPO

PACKAGE = REPO / "framework"
# bottom to top; a module belongs to the first entry that is its name or a package holding it
LAYERS = [
    ["framework.common"],
    ["framework.session"],  # how this process started: knows no config schema, strategy or result file
    ["framework.config"],
    ["framework.data", "framework.models", "framework.checkpoints", "framework.results"],
    ["framework.telemetry"],
    ["framework.training"],
    ["framework.callbacks"],
    ["framework.launch"],
    ["framework.strategies"],
    ["framework.assemble"],
    ["framework.worker", "framework.preflight", "framework.evaluate", "framework.sample", "framework.run",
     "framework.devices", "framework.verify", "framework.cli", "framework"],
]
ROOT_MODULES_AT_MOST = 8  # the package's root holds the commands and the run's story; the rest lives in packages


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer_of(module: str) -> int:
    for index, layer in enumerate(LAYERS):
        if any(module == name or module.startswith(name + ".") for name in layer if name != "framework"):
            return index
    if module == "framework":
        return len(LAYERS) - 1
    raise AssertionError(f"{module} is in no layer of tests/test_layers.py")


def imported_modules(node) -> list[str]:
    """The framework modules an import statement reads (`from framework.x import y` reads framework.x.y when that is
    a module, else framework.x)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.startswith("framework")]
    if node.module is None or node.level or not node.module.startswith("framework"):
        return []
    return [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in MODULES else node.module for a in node.names]


def imports_of(path: Path) -> list[tuple[ast.AST, bool]]:
    """Every import statement, and whether it sits at the module's top level (an `if TYPE_CHECKING:` block there
    counts as top level)."""
    tree = ast.parse(path.read_text())
    top = set()
    for node in tree.body:
        top.add(id(node))
        if isinstance(node, ast.If):
            top.update(id(n) for n in node.body)
    return [(n, id(n) in top) for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]


def graph() -> dict[str, set[str]]:
    return {name: {m for node, _ in imports_of(path) for m in imported_modules(node)} for name, path in MODULES.items()}


def test_every_module_has_a_layer():
    for name in MODULES:
        layer_of(name)


def test_no_import_runs_up_the_layers():
    upward = [f"{name} (layer {layer_of(name)}) imports {target} (layer {layer_of(target)})"
              for name, targets in graph().items() for target in sorted(targets) if layer_of(target) > layer_of(name)]
    assert not upward, "\n".join(upward)


def test_no_circle_of_imports():
    edges = graph()
    circles, done = [], set()

    def visit(name, path):
        if name in path:
            circles.append(" -> ".join(path[path.index(name):] + [name]))
            return
        if name in done:
            return
        for target in sorted(edges.get(name, ())):
            if target != name:
                visit(target, path + [name])
        done.add(name)

    for name in edges:
        visit(name, [])
    assert not circles, "\n".join(sorted(set(circles)))


def test_imports_sit_at_the_top_unless_optional_and_said_why():
    problems = []
    for name, path in MODULES.items():
        lines = path.read_text().splitlines()
        for node, at_top in imports_of(path):
            if at_top:
                continue
            if imported_modules(node):
                problems.append(f"{path.relative_to(REPO)}:{node.lineno}: a framework module imported inside a function")
                continue
            here, above = lines[node.lineno - 1], lines[node.lineno - 2] if node.lineno > 1 else ""
            if "#" not in here and not above.strip().startswith("#"):
                problems.append(f"{path.relative_to(REPO)}:{node.lineno}: `{here.strip()}` inside a function with no "
                                "comment saying why (an optional or slow package)")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("layer", range(len(LAYERS)))
def test_each_layer_names_modules_that_exist(layer):
    for name in LAYERS[layer]:
        assert name == "framework" or any(m == name or m.startswith(name + ".") for m in MODULES), name


def test_the_package_root_holds_only_a_few_modules():
    root = sorted(p.stem for p in PACKAGE.glob("*.py"))
    assert len(root) <= ROOT_MODULES_AT_MOST, root
