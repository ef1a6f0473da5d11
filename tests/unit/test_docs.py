"""README.md and docs/ cannot rot: every relative link and #anchor in them resolves (a file or folder of this
repository; a heading by GitHub's anchor rules), and every `python train.py|eval.py|sample.py|verify.py ...` line of
a fenced code block composes with Hydra's compose API, as `--cfg job` would (in-process, through conftest's
composed()): a renamed group option, key or preset fails here. plan.py's lines compose as plan.py composes them
(its plan.* keys apart, every combination of its comma lists) and pass its refusals (a card, a strategy it cannot
plan yet). A sweep's values are composed each (one composition
per value, not their product); a placeholder such as `ckpt_path=<run>` stands for a run folder that does not exist
here, so its value is a dummy and the rest of the line is composed. Every training command (train.py, hydra-dist) also
passes every check its driver makes before a worker would start (support.driver.driver_says: Hydra's composition as
the command line gives it, the strategy chosen for this machine, every value, the data and a dry run of the model),
each job of a sweep on its own, on the CPU as every test is."""
from __future__ import annotations

import functools
import re
import shlex
import sys
import tempfile
from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser

from support.driver import composed, driver_says
from support.processes import REPO

from framework.plan.command import composed_runs, plan_options
from framework.plan.gpus import chosen_gpu
from framework.plan.rows import check_plannable

PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
FENCE = re.compile(r"^\s*(```|~~~)\s*([\w+-]*)")
CODE_SPAN = re.compile(r"(`+).+?\1")
COMMENT = re.compile(r"<!--.*?-->", re.S)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
SHELL = ("", "bash", "sh", "shell", "console")
SCRIPTS = {"train.py": "config", "eval.py": "eval", "sample.py": "sample", "verify.py": "verify", "plan.py": "plan",
           "hydra-dist": "config", "hydra-dist-eval": "eval", "hydra-dist-sample": "sample",
           "hydra-dist-verify": "verify", "hydra-dist-plan": "plan"}
STARTERS = ("python", "python3", "torchrun", "deepspeed", "horovodrun", "srun")
FLAGS_WITH_VALUE = ("--cfg", "-c", "--info", "-i", "--package", "-p", "--shell-completion", "-sc")


def split_page(text: str) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """The page's lines outside fenced code blocks, and each block (its language, its lines)."""
    prose, blocks, block, fence = [], [], None, None
    for line in text.splitlines():
        match = FENCE.match(line)
        if block is None and match:
            block, fence = (match.group(2).lower(), []), match.group(1)
        elif block is not None and line.strip().startswith(fence):
            blocks.append(block)
            block = None
        elif block is not None:
            block[1].append(line)
        else:
            prose.append(line)
    return prose, blocks


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: its rendered text lowercased, all but letters, digits, _, - and spaces dropped,
    spaces as hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
    text = re.sub(r"(\*\*|__|\*)", "", text)
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    for line in split_page(page.read_text())[0]:
        match = HEADING.match(line)
        if match:
            base = slug(match.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
    return {base if n == 0 else f"{base}-{n}" for base, count in seen.items() for n in range(count)}


def links(page: Path) -> list[str]:
    prose = COMMENT.sub("", "\n".join(split_page(page.read_text())[0]))
    return LINK.findall(CODE_SPAN.sub("code", prose))


def relative_links() -> list[tuple[Path, str]]:
    return [(page, target) for page in PAGES for target in links(page)
            if not re.match(r"^[a-z][a-z+.-]*:", target)]  # http:, https:, mailto: are not this repository's


def commands() -> list[tuple[Path, str]]:
    """Every line of a shell code block that runs train.py, eval.py, sample.py or verify.py (continuations joined)."""
    found = []
    for page in PAGES:
        for language, lines in split_page(page.read_text())[1]:
            if language not in SHELL:
                continue
            for line in re.sub(r"\\\n\s*", " ", "\n".join(lines)).splitlines():
                words = line.split()
                starts = [w for w in words if "=" not in w or w.startswith("-")][:1]  # after VAR=value
                if starts and (starts[0].endswith(STARTERS) or starts[0].startswith("hydra-dist")) and \
                        any(Path(w).name in SCRIPTS for w in words):
                    found.append((page, line.strip()))
    return found


def command_of(line: str) -> tuple[str, list[str], Path | None]:
    """(config name, overrides, --config-dir) of a documented command line."""
    words = shlex.split(re.sub(r"<[^>]*>", "placeholder", line), comments=True)
    at = next(i for i, w in enumerate(words) if Path(w).name in SCRIPTS)
    config, overrides, config_dir, rest = SCRIPTS[Path(words[at]).name], [], None, iter(words[at + 1:])
    for word in rest:
        if word in ("--config-dir", "-cd"):
            config_dir = REPO / next(rest)
        elif word.startswith("--config-dir="):
            config_dir = REPO / word.split("=", 1)[1]
        elif word in FLAGS_WITH_VALUE:
            next(rest, None)
        elif word.startswith("-") or word == "...":
            continue  # -m, --help, --multirun: the overrides compose the same
        else:
            overrides.append(word)
    return config, overrides, config_dir


def compositions(overrides: list[str]) -> list[list[str]]:
    """A sweep's overrides as plain ones: composition i takes each sweep's value i (cycling), so every value of
    every sweep is composed once."""
    parsed = OverridesParser.create().parse_overrides(overrides)
    choices = []
    for text, override in zip(overrides, parsed):
        if override.is_sweep_override() and override.is_discrete_sweep():
            key = override.get_key_element()
            choices.append([f"{key}={value}" for value in override.sweep_string_iterator()])
        elif not override.is_sweep_override():  # interval(): Optuna's to sample, nothing to compose
            choices.append([text])
    return [[values[i % len(values)] for values in choices] for i in range(max(map(len, choices), default=1))]


LINKS = relative_links()
COMMANDS = commands()


def test_the_pages_have_links_and_commands_to_check():
    assert len(PAGES) >= 9 and len(LINKS) >= 50 and len(COMMANDS) >= 40, (len(PAGES), len(LINKS), len(COMMANDS))


def test_every_relative_link_and_anchor_resolves():
    broken = []
    for page, target in LINKS:
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{page.relative_to(REPO)}: {target} (no {file.relative_to(REPO)})")
        elif anchor and (file.suffix != ".md" or anchor not in anchors(file)):
            broken.append(f"{page.relative_to(REPO)}: {target} (no heading #{anchor} in {file.relative_to(REPO)})")
    assert not broken, "\n".join(broken)


def test_the_slug_rules_are_githubs():
    assert slug("Install as a command: `hydra-dist`") == "install-as-a-command-hydra-dist"
    assert slug("Telling GPUs apart: busy vs wait, FLOPs, MFU, stragglers") == \
        "telling-gpus-apart-busy-vs-wait-flops-mfu-stragglers"
    assert slug("Sampling text: `sample.py`") == "sampling-text-samplepy"
    assert slug("Using the result: `eval.py` and `load_model`") == "using-the-result-evalpy-and-load_model"


@functools.lru_cache(maxsize=None)
def composes(config: str, overrides: tuple[str, ...], config_dir: Path | None) -> None:
    """Raises what Hydra raises; each distinct composition once (pages repeat commands, and one costs ~0.5 s)."""
    composed(*overrides, hydra=True, config_name=config, config_dir=config_dir)


@pytest.mark.parametrize("page,line", COMMANDS, ids=[f"{p.relative_to(REPO)}:{i}" for i, (p, _) in
                                                     enumerate(COMMANDS)])
def test_every_documented_command_composes(page, line):
    config, overrides, config_dir = command_of(line)
    if config == "plan":
        return plan_composes(overrides, config_dir)
    if not multirun(line):  # Hydra refuses a value list without -m ("Ambiguous value"), as the shell hands it over
        listed = [text for text, override in zip(overrides, OverridesParser.create().parse_overrides(overrides))
                  if override.is_sweep_override()]
        assert not listed, f"{page.relative_to(REPO)}: {line}\n  a list without -m: {listed} (quote it for Hydra)"
    for overrides_now in compositions(overrides):
        composes(config, tuple(overrides_now), config_dir)


def plan_composes(overrides: list[str], config_dir: Path | None) -> None:
    """plan.py's command as plan.py reads it, up to where it would trace: its plan.* keys and card, every combination
    of its comma lists composed as plan.py composes them (a one-process strategy without strategy.nproc_per_node),
    and each refused where it cannot be planned."""
    options, rest = plan_options(overrides)
    chosen_gpu(options.gpu)
    for cfg in composed_runs(rest, str(config_dir) if config_dir else None):
        check_plannable(cfg)


TRAINING = [(page, line) for page, line in COMMANDS if command_of(line)[0] == "config"]


def multirun(line: str) -> bool:
    words = shlex.split(re.sub(r"<[^>]*>", "placeholder", line), comments=True)
    return bool({"-m", "--multirun"} & set(words))


def runs_of(line: str) -> list[list[str]]:
    """The overrides of each run a training command starts: its own, or with -m each job of its sweep (a value list
    without -m is Hydra's to refuse, as the command line would)."""
    overrides = command_of(line)[1]
    return compositions(overrides) if multirun(line) else [overrides]


def python_path_of(line: str) -> list[Path]:
    """The folders a command puts on PYTHONPATH (`PYTHONPATH=examples/my_project python train.py ...`)."""
    words = shlex.split(line, comments=True)
    return [REPO / folder for word in words[:next(i for i, w in enumerate(words) if "=" not in w)]
            if word.startswith("PYTHONPATH=") for folder in word.split("=", 1)[1].split(":")]


@functools.lru_cache(maxsize=None)
def driver_verdict(overrides: tuple[str, ...], config_dir: Path | None, python_path: tuple[Path, ...]) -> str:
    """What the driver says of one run (each distinct run once: the pages repeat commands), in a fresh folder."""
    sys.path[:0] = map(str, python_path)
    try:
        with tempfile.TemporaryDirectory() as run_dir:
            return driver_says(list(overrides), Path(run_dir), config_dir)
    finally:
        del sys.path[:len(python_path)]
        for name in [n for n in sys.modules if n == "mypkg" or n.startswith("mypkg.")]:
            del sys.modules[name]  # each command imports the user's package from its own PYTHONPATH


@pytest.mark.parametrize("page,line", TRAINING, ids=[f"{p.relative_to(REPO)}:{i}" for i, (p, _) in
                                                     enumerate(TRAINING)])
def test_every_documented_training_command_passes_the_drivers_checks(page, line):
    _, _, config_dir = command_of(line)
    for overrides in runs_of(line):
        said = driver_verdict(tuple(overrides), config_dir, tuple(python_path_of(line)))
        assert said == "", f"{page.relative_to(REPO)}: {line}\n  refused: {said}"
