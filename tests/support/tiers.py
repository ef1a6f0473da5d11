"""Which tests start processes, read from their source: a test whose body, a fixture it uses, or a helper of the
tests they call (transitively) names a process starter. tests/conftest.py keeps such tests out of tests/unit/."""
from __future__ import annotations

import ast
import inspect
import textwrap
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
STARTERS = {"run_train", "subprocess", "Popen", "spawn", "runpytest_subprocess", "runs",
            "world2", "world4", "GlooWorld", "start_train", "run_eval"}
_starts: dict = {}


def _names_in(function) -> set[str]:
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    except (OSError, TypeError, SyntaxError):
        return set()
    names = {n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(tree)
             if isinstance(n, (ast.Name, ast.Attribute))}
    return names | {a.arg for n in ast.walk(tree) if isinstance(n, ast.arguments) for a in n.args}


def _in_tests(function) -> bool:
    code = getattr(function, "__code__", None)
    return code is not None and Path(code.co_filename).resolve().is_relative_to(TESTS)


def _starts_processes(function) -> bool:
    """Whether a test-side function names a process starter, itself or through the test helpers it calls."""
    function = getattr(function, "__wrapped__", function)
    key = getattr(function, "__code__", function)
    if key in _starts:
        return _starts[key]
    _starts[key] = False  # a helper that recurses into itself
    names = _names_in(function)
    found = bool(names & STARTERS)
    scope = getattr(function, "__globals__", {})
    for name in names - STARTERS:
        if found:
            break
        helper = scope.get(name)
        if callable(helper) and _in_tests(helper):
            found = _starts_processes(helper)
    _starts[key] = found
    return found


def starts_processes(item) -> bool:
    """Whether a collected test (its function or a fixture of the tests' it uses) starts a process."""
    if not hasattr(item, "function"):
        return False
    fixtures = getattr(item, "_fixtureinfo", None)
    definitions = [d for defs in (fixtures.name2fixturedefs.values() if fixtures else ()) for d in defs]
    return any(_starts_processes(f) for f in [item.function, *(d.func for d in definitions if _in_tests(d.func))])
