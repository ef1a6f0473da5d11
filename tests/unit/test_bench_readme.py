"""bench/README.md's commands run as written: every code span naming a benchmark (`bench/NAME.py ...`, with or without
the `.venv/bin/python` before it, across a line break too), and arguments alone after one in the same table row or
paragraph (`--model mlp`), are parsed by that script's own parse_args in this process, with the script's checks of the
argument combination (bench/benchkit/arguments.py: names from fixed lists, a timed window its progress lines mark),
without running the benchmark; where the command's arguments become train.py overrides (a script's train_commands:
strategies.py, time_to_accuracy.py), train.py's driver checks each run in this process too (support/driver.py). Each
script is imported as `python bench/NAME.py` imports it (bench/ first on the path), so a name it imports that is gone
fails here too. Every benchmark has a command on the page, and every --flag the page names with no script before it
is some benchmark's flag. Issue 53: the char_lm row's `--warmup-steps 10` without `--log-every 10` failed after its
first run ("no progress line for step(s) [10]")."""
from __future__ import annotations

import functools
import importlib.util
import re
import shlex
import sys
import tempfile
from pathlib import Path

import pytest

from support.driver import driver_says
from support.processes import REPO

BENCH = REPO / "bench"
README = BENCH / "README.md"
FENCED = re.compile(r"^\s*(```|~~~).*?^\s*\1[^\n]*$", re.S | re.M)
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)
SCRIPT = re.compile(r"(?:^|/)bench/(\w+)\.py$")
FLAG = re.compile(r"(?<![\w-])--[a-z][\w-]*")


def code_spans() -> list[tuple[int, int, str]]:
    """(line, block, text with its whitespace runs made one space) of every inline code span outside fenced blocks;
    a block is a table row, a list item or a paragraph."""
    text = README.read_text()
    text = FENCED.sub(lambda m: "\n" * m.group(0).count("\n"), text)  # keeps the line numbers
    block_of, block = [], 0
    for line in text.splitlines():
        block += not line.strip() or line.lstrip().startswith(("|", "- ", "#"))
        block_of.append(block)
    spans = []
    for m in CODE_SPAN.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        spans.append((line, block_of[line - 1], " ".join(m.group(2).split())))
    return spans


def commands() -> tuple[list[tuple[int, str, list[str]]], list[str]]:
    """(line, script name, its arguments) of every benchmark command on the page, and the flags named on their own.
    Arguments alone (`--model mlp`) belong to the last script named before them in their row, item or paragraph;
    with none there, they only name flags."""
    found, flags, last = [], [], {}
    for line, block, span in code_spans():
        if span.startswith("--"):
            if block in last:
                found.append((line, last[block], shlex.split(span)))
            else:
                flags.append(span)
            continue
        for part in re.split(r";|&&", span):
            if "bench/" not in part:
                continue
            words = shlex.split(part)
            at = next((i for i, w in enumerate(words) if SCRIPT.search(w)), None)
            if at is not None and (BENCH / f"{SCRIPT.search(words[at]).group(1)}.py").is_file():
                last[block] = SCRIPT.search(words[at]).group(1)
                found.append((line, last[block], words[at + 1:]))
    return found, flags


COMMANDS, FLAGS_ALONE = commands()
SCRIPTS = sorted(path.stem for path in BENCH.glob("*.py"))


@pytest.fixture(scope="module")
def bench_script():
    """Imports bench/NAME.py as running it does; afterwards the path and every module loaded from bench/ are as
    before (a script's own sys.path.insert included)."""
    path, loaded = list(sys.path), {}
    sys.path.insert(0, str(BENCH))

    def load(name: str):
        if name not in loaded:
            spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module  # dataclasses and pickling look their module up there
            spec.loader.exec_module(module)
            loaded[name] = module
        return loaded[name]

    yield load
    sys.path[:] = path
    for name, module in list(sys.modules.items()):
        if (getattr(module, "__file__", None) or "").startswith(str(BENCH)):
            del sys.modules[name]


def refusal(script, argv: list[str], capsys) -> str | None:
    """'exit CODE: argparse's error line' for these arguments, or None when the script takes them."""
    try:
        script.parse_args(argv)
    except SystemExit as exc:
        lines = capsys.readouterr().err.strip().splitlines()
        return f"exit {exc.code}: {lines[-1] if lines else ''}"
    return None


def test_every_benchmark_has_a_command_on_the_page():
    assert len(COMMANDS) >= 40, len(COMMANDS)
    assert sorted({name for _, name, _ in COMMANDS}) == SCRIPTS


@functools.lru_cache(maxsize=None)
def driver_verdict(overrides: tuple[str, ...]) -> str:
    """What train.py's driver says to these overrides ('' when it takes them); each distinct run once (the page
    repeats them)."""
    with tempfile.TemporaryDirectory() as run_dir:
        return driver_says(list(overrides), Path(run_dir))


@pytest.mark.parametrize("line,name,argv", COMMANDS, ids=[f"README.md:{line}:{name}" for line, name, _ in COMMANDS])
def test_every_command_on_the_page_is_taken_by_its_script(bench_script, capsys, line, name, argv):
    """And where the command's own arguments become train.py overrides (strategies.py's variants and --override,
    time_to_accuracy.py's --override: the script's train_commands), train.py's driver takes each run."""
    script = bench_script(name)
    command = f"bench/README.md:{line}: `bench/{name}.py {shlex.join(argv)}`"
    why = refusal(script, argv, capsys)
    assert why is None, f"{command} is refused: {why}"
    for overrides in getattr(script, "train_commands", lambda _: [])(script.parse_args(argv)):
        verdict = driver_verdict(tuple(overrides))
        assert not verdict, f"{command}: train.py {shlex.join(overrides)} is refused: {verdict}"


def test_every_flag_the_page_names_on_its_own_is_a_benchmarks(bench_script, capsys):
    """`--threads N`, `--target 0.91`: flags the prose names with no script before them (parsed by none)."""
    flags = set()
    for name in SCRIPTS:
        with pytest.raises(SystemExit):
            bench_script(name).parse_args(["--help"])
        flags |= set(FLAG.findall(capsys.readouterr().out))
    named = {flag for span in FLAGS_ALONE for flag in FLAG.findall(span)}
    assert named and named <= flags, sorted(named - flags)


REFUSED = {  # a combination each kind of check refuses, and what its error names
    "the README's char_lm row before the fix": ("char_lm", ["--repeats", "2", "--warmup-steps", "10", "--steps", "30"],
                                                "--warmup-steps=10 and --steps=30 must be multiples of --log-every=20"),
    "a mode no side runs": ("overhead", ["--modes", "single,dpp"], "--modes=single,dpp: 'dpp' is not one of"),
    "a schedule misspelt": ("model_parallel", ["--variants", "pp2_gpipe"], "'pp2_gpipe' is not one of"),
    "no step after the warm-up": ("model_parallel", ["--steps", "2"], "--warmup-steps=2 must be below --steps=2"),
    "the sleepy model under tensor parallel": ("model_parallel", ["--sleepy", "20,40"], "tp2 cannot split the sleepy"),
    "a strategy misspelt": ("strategies", ["--strategies", "ddp,fdsp"], "'fdsp' names no strategy"),
    "a ZeRO stage of ddp": ("strategies", ["--strategies", "ddp:2"], "deepspeed:N with N 0 to 3 only"),
    "a model train.py does not have": ("speedups", ["--models", "lenet5"], "'lenet5' is not one of"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_combination_that_cannot_run_is_refused_with_one_line_naming_it(bench_script, capsys, case):
    name, argv, message = REFUSED[case]
    why = refusal(bench_script(name), argv, capsys)
    assert why is not None and why.startswith("exit 2: ") and message in why, why
