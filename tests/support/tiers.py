"""The unit tier's two guards (tests/conftest.py applies both to tests/unit/):

- at collection, which tests start processes, read from their source: a test whose body, a fixture it uses, or a
  helper of the tests they call (transitively) names a process starter of STARTERS (a quick, early refusal of the
  usual ways; it cannot see a start inside the framework or a library, or one under another name);
- at run time, what each test did start (support/launches.py notes every start in this process): a unit test that
  started anything ALLOWED does not name fails when it ends."""
from __future__ import annotations

import ast
import inspect
import re
import textwrap
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
STARTERS = {"run_train", "subprocess", "Popen", "check_output", "check_call", "spawn", "posix_spawn", "fork",
            "Process", "runpytest_subprocess", "runs", "world2", "world4", "GlooWorld", "start_train", "run_eval"}
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


# What a unit test may start, and why: tests/conftest.py fails a test in tests/unit/ that started anything else (a
# start support/launches.py noted: a subprocess, os.system, a fork, a multiprocessing process).
ALLOWED: tuple[tuple[re.Pattern, str], ...] = (
    (re.compile(r"^subprocess: (\S*/)?(g\+\+|gcc|c\+\+|cc|clang\+\+|clang) "),
     "inductor (torch.compile's default backend) builds the CPU kernels it generates with the C++ compiler: a unit "
     "test of compiled code compiles it (test_compile_and_recompute.py, test_speedups.py)"),
    (re.compile(r"^subprocess: openssl sha512 "),
     "inductor hashes its precompiled header's preprocessed text with openssl (torch/_inductor/codecache.py)"),
    (re.compile(r"^subprocess: git -C "),
     "provenance reads the project's commit, status and diff with git (framework/results/provenance.py): every "
     "command run in-process records it, and test_provenance.py checks it"),
    (re.compile(r"^subprocess: nvidia-smi "),
     "the GPU listing asks nvidia-smi where NVML is missing (framework/results/provenance.py, devices)"),
    (re.compile(r"^subprocess: \S*python\S* -c import torch; print\(torch\.cuda\.device_count\(\)\)$"),
     "joblib's slots count the GPUs in a child (framework/session/slots.py): the CUDA driver fixes a process's "
     "devices when first asked, which this process must not be; only where libcuda is installed"),
    (re.compile(r"^multiprocessing: \S+ \(torch\.utils\.data\._utils\.worker\._worker_loop\)$"),
     "torch's DataLoader workers: how a stream deals its samples to a loader's workers is decided in those workers "
     "(test_streams.py)"),
)


def not_allowed(launched: list[str]) -> list[str]:
    """The starts (support/launches.py's lines) that no entry of ALLOWED matches."""
    return [line for line in launched if not any(pattern.search(line) for pattern, _ in ALLOWED)]
