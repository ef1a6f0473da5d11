"""What a callback may read and call is one object, LoopState (framework/training/loop_state.py), documented in
docs/loop-features.md: every hook gets it, and the built-in callbacks, the tests' fault injection and user code and
the example project's callback use only its public names, never an attribute of an attribute of an attribute.
Read from the source (every `state.x` in a hook's code), in-process."""
import ast
import inspect
from pathlib import Path

from framework.training.callback import HOOKS, Callback
from framework.training.loop_state import LoopState
from support.processes import FAULTS, REPO, USER_CODE

CALLBACK_FILES = sorted([*(REPO / "framework" / "callbacks").glob("*.py"), FAULTS / "fault_injection.py",
                         *USER_CODE.glob("*.py"), REPO / "examples/my_project/mypkg/callbacks.py"])
DOC = REPO / "docs" / "loop-features.md"


def public_names() -> set[str]:
    """LoopState's methods and properties, and the attributes its __init__ sets, leaving out the private ones."""
    names = {n for n, _ in inspect.getmembers(LoopState) if not n.startswith("_")}
    init = ast.parse(inspect.getsource(LoopState.__init__).strip().replace("\n    ", "\n"))
    for node in ast.walk(init):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            if isinstance(node.ctx, ast.Store) and not node.attr.startswith("_"):
                names.add(node.attr)
    return names


def state_uses(path: Path) -> list[tuple[int, list[str]]]:
    """Each `state.a.b...` chain in a file: its line and its attribute names (a callback's hooks name it `state`;
    load_state_dict's `state` is the dict a checkpoint kept, not the LoopState)."""
    chains = []
    functions = [f for f in ast.walk(ast.parse(path.read_text()))
                 if isinstance(f, ast.FunctionDef) and f.name != "load_state_dict"]
    for node in {n for f in functions for n in ast.walk(f)}:
        if not isinstance(node, ast.Attribute):
            continue
        parts, inner = [], node
        while isinstance(inner, ast.Attribute):
            parts.insert(0, inner.attr)
            inner = inner.value
        if isinstance(inner, ast.Name) and inner.id == "state":
            chains.append((node.lineno, parts))
    return chains


def test_every_hook_takes_the_state_first():
    for hook in HOOKS:
        assert list(inspect.signature(getattr(Callback, hook)).parameters)[1] == "state", hook


def test_callbacks_use_only_the_documented_surface():
    allowed = public_names()
    wrong = [f"{path.relative_to(REPO)}:{line}: state.{'.'.join(parts)}"
             for path in CALLBACK_FILES for line, parts in state_uses(path) if parts[0] not in allowed]
    assert not wrong, "not on LoopState:\n" + "\n".join(wrong)
    builtin = [p for p in CALLBACK_FILES if p.parent.name == "callbacks" and p.name not in ("__init__.py", "base.py")]
    assert len(builtin) >= 8 and all(state_uses(path) for path in builtin), "the scan sees each built-in's hooks"


def test_nothing_reaches_three_attributes_deep():
    # state.totals.val_metrics is a record's field; state.x.y.z would be reaching through an object into another
    deep = [f"{path.relative_to(REPO)}:{line}: state.{'.'.join(parts)}"
            for path in CALLBACK_FILES for line, parts in state_uses(path)
            if len(parts) >= 3 and parts[-1] not in ("get", "items")]
    assert not deep, "\n".join(deep)


def test_every_public_name_is_documented():
    text = DOC.read_text()
    missing = sorted(n for n in public_names() if f"`{n}" not in text)
    assert not missing, f"LoopState names not in {DOC.relative_to(REPO)}: {missing}"
