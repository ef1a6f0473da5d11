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
     "framework.devices", "framework.verify", "framework.plan", "framework.cli", "framework"],
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


# The driver's front door imports the commands themselves inside its Hydra apps, once the config is composed: torch
# comes with them, and train.py starts the workers' template before that (tests/runs/test_startup_imports.py). The
# mesh imports its sharded side (DTensor, FSDP2, DCP) only where the degrees need it: a ddp worker never does; the
# driver imports the planner only where it plans (a GPU run's check_fit): a CPU run skips its ~21 ms.
IMPORTED_LATE = {"framework.cli": {"framework.run", "framework.evaluate", "framework.sample", "framework.verify.command"},
                 "framework.strategies.mesh.engine": {"framework.strategies.mesh.sharded"},
                 "framework.run": {"framework.plan.fit", "framework.plan.gpus"}}


def test_imports_sit_at_the_top_unless_optional_and_said_why():
    problems = []
    for name, path in MODULES.items():
        lines = path.read_text().splitlines()
        for node, at_top in imports_of(path):
            if at_top:
                continue
            if imported_modules(node) and not set(imported_modules(node)) <= IMPORTED_LATE.get(name, set()):
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


# ---- the launch situation: read once, in framework/session/, and handed down ------------------------------------

SESSION = "framework.session"
# What session/ reads a process's launch situation with: nothing else imports them (the ranks are handed in)
SESSION_READERS = {"_ranks", "ranks", "read_ranks", "adopt_scheduler_ranks", "started_by_submitit", "situation"}
# The variables session/ reads (torchrun's, the elastic agent's, SLURM's and submitit's, horovodrun's), and the
# prefixes of launchers' families; outside session/ no module reads one from os.environ
LAUNCHER_VARIABLES = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                      "HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE",
                      "SLURM_STEP_NUM_TASKS", "SLURM_PROCID", "SUBMITIT_EXECUTOR", "TORCHELASTIC_RESTART_COUNT",
                      "TORCHELASTIC_USE_AGENT_STORE"}
LAUNCHER_PREFIXES = ("SLURM_", "SUBMITIT_", "HOROVOD_", "OMPI_", "PMI_", "TORCHELASTIC_")
# Where a process asks session/ how it started, once each: every command's entry (train.py's twice: its front door
# before Hydra composes, which a rank > 0 never passes, and its job, which Hydra's launcher may run in another
# process: a joblib pool worker, a submitit task) and the first function of a worker that hydra-dist's starters start
ASKS_ONCE = {
    "detect": {"framework.cli._main", "framework.cli.train_app", "framework.evaluate.evaluate_command",
               "framework.verify.command.verify_command", "framework.devices.main"},
    "worker_ranks": {"framework.launch.elastic._worker", "framework.launch.horovod_runner.run_worker"},
}


def outside_session():
    return {name: path for name, path in MODULES.items() if not (name == SESSION or name.startswith(SESSION + "."))}


def test_no_module_outside_session_imports_its_readers_or_hydras_run_mode():
    found = []
    for name, path in outside_session().items():
        for node, _ in imports_of(path):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(SESSION):
                found += [f"{name}: {a.name} from {node.module}" for a in node.names if a.name in SESSION_READERS]
            if isinstance(node, ast.ImportFrom) and node.module == "hydra.types":
                found += [f"{name}: hydra.types.{a.name}" for a in node.names if a.name == "RunMode"]
    assert not found, "\n".join(found)


def _constants(tree: ast.Module) -> dict[str, str]:
    """A module's top-level names bound to a string."""
    return {t.id: node.value.value for node in tree.body if isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
            for t in node.targets if isinstance(t, ast.Name)}


def _is_os_environ(node) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "environ" and isinstance(node.value, ast.Name)
            and node.value.id == "os")


def environment_reads(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, variable) of every os.environ[...] read, os.environ.get/pop(...), os.getenv(...) and `... in
    os.environ` whose variable is a string (or a module constant holding one)."""
    constants = _constants(tree)

    def name_of(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        return constants.get(node.id) if isinstance(node, ast.Name) else None

    reads = []
    for node in ast.walk(tree):
        key = None
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and _is_os_environ(node.value):
            key = node.slice
        elif isinstance(node, ast.Call) and node.args and isinstance(node.func, ast.Attribute):
            f = node.func
            if (f.attr in ("get", "pop") and _is_os_environ(f.value)) or (
                    f.attr == "getenv" and isinstance(f.value, ast.Name) and f.value.id == "os"):
                key = node.args[0]
        elif isinstance(node, ast.Compare) and any(_is_os_environ(c) for c in node.comparators):
            key = node.left
        if key is not None and name_of(key) is not None:
            reads.append((node.lineno, name_of(key)))
    return reads


def is_launcher_variable(name: str) -> bool:
    return name in LAUNCHER_VARIABLES or name.startswith(LAUNCHER_PREFIXES)


def test_no_module_outside_session_reads_a_launchers_environment():
    found = [f"{path.relative_to(REPO)}:{line}: {variable}" for path in outside_session().values()
             for line, variable in environment_reads(ast.parse(path.read_text())) if is_launcher_variable(variable)]
    assert not found, "\n".join(found)


def test_the_launcher_variables_are_the_ones_session_reads():
    """The list above is true: session/ reads each of them itself, so a launcher it learns of joins the list here."""
    read = {variable for name, path in MODULES.items() if name.startswith(SESSION)
            for _, variable in environment_reads(ast.parse(path.read_text()))}
    source = "".join(path.read_text() for name, path in MODULES.items() if name.startswith(SESSION))
    assert {v for v in read if v not in ("PYTHONPATH", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS")} <= LAUNCHER_VARIABLES
    assert all(f'"{v}"' in source for v in LAUNCHER_VARIABLES)


def _called(call: ast.Call) -> str | None:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None


def callers(tree: ast.Module, names) -> list[tuple[str, str]]:
    """(name, the innermost function around the call, or <module>) for every call of one of these names."""
    found = []

    def visit(node, where):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Call) and _called(child) in names:
                found.append((_called(child), where))
            visit(child, child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else where)

    visit(tree, "<module>")
    return found


SITUATIONS = ("Session", "Direct", "OuterRank0", "SweepUnderRanks", "SweepJob", "SchedulerRank0", "PoolJob", "Follower")


def test_each_command_asks_how_it_started_once_and_nothing_else_asks():
    """detect() at each command's entry, worker_ranks() where a started worker begins: once each, nowhere else (the
    Ranks they answer are handed to the strategy, its starter and group). A command with no job of a session ends
    with refuse(exc), never with a session of its own making (Direct().fail)."""
    asked = {reader: {} for reader in ASKS_ONCE}
    made = []
    for name, path in outside_session().items():
        for called, where in callers(ast.parse(path.read_text()), {*ASKS_ONCE, *SITUATIONS}):
            if called in ASKS_ONCE:
                asked[called][f"{name}.{where}"] = asked[called].get(f"{name}.{where}", 0) + 1
            else:
                made.append(f"{name}.{where}: {called}(...)")
    expected = {reader: dict.fromkeys(where, 1) for reader, where in ASKS_ONCE.items()}
    assert asked == expected, f"asked {asked}, expected {expected}"
    assert not made, "\n".join(made)


# ---- engines: each stands on the shared bases, never on a sibling engine ----------------------------------------

STRATEGIES = "framework.strategies"
# what every engine may build on: the interface and the torch.distributed engines' base
ENGINE_BASES = {f"{STRATEGIES}.base", f"{STRATEGIES}.torch_distributed"}


def _defines_a_strategy(path: Path) -> bool:
    bases = [b for node in ast.parse(path.read_text()).body if isinstance(node, ast.ClassDef) for b in node.bases]
    return any((b.id if isinstance(b, ast.Name) else getattr(b, "attr", "")).endswith("Strategy") for b in bases)


def engine_of(module: str) -> str:
    """The engine a module of strategies/ belongs to: its package below strategies/ (the mesh's mesh/),
    else the module itself."""
    return ".".join(module.split(".")[:3])


def engines() -> set[str]:
    """Every engine: a module (or package below strategies/) that defines a Strategy subclass, the bases aside."""
    return {engine_of(name) for name, path in MODULES.items()
            if name.startswith(STRATEGIES + ".") and name not in ENGINE_BASES and _defines_a_strategy(path)}


def sibling_engine_imports(edges: dict[str, set[str]]) -> list[str]:
    """module -> engine imports of strategies/ that cross from one engine (or a shared piece) into an engine of its
    own; the package's __init__ (strategy=auto picks ddp or single) aside."""
    found, known = [], engines()
    for name, targets in edges.items():
        if not name.startswith(STRATEGIES + "."):
            continue
        found += [f"{name} imports {target}" for target in sorted(targets)
                  if engine_of(target) in known and engine_of(target) != engine_of(name)]
    return found


def test_the_engines_are_found():
    """ddp, fsdp, hsdp, tp and pp are presets of the one mesh engine (mesh/), not engines of their own."""
    assert engines() == {f"{STRATEGIES}.{e}" for e in ("single", "dp", "deepspeed", "horovod", "mesh")}


def test_no_engine_imports_a_sibling_engine():
    """An engine builds on base.py and torch_distributed.py and on shared pieces (groups.py, starters.py,
    ...); what another engine needs from it moves to a shared module, and what the driver asks of every engine is a
    property of the engine (Strategy.muon_steps), not an isinstance check across engines."""
    found = sibling_engine_imports(graph())
    assert not found, "\n".join(found)
