"""What a run (or a sweep) ran: provenance.json in its folder, with the uncommitted changes beside it as patches.

The record holds the git state of the user's project (the repository of the --config-dir, else of the current
directory) and of hydra-dist itself (its checkout, or its installed version), the command (argv, overrides, config
dir), the versions that decide behaviour (Python, torch, CUDA, cuDNN, NCCL, DeepSpeed, Horovod, Hydra), every
installed package, the host, its GPUs (NVML or nvidia-smi: no CUDA context in the driver) and the environment
variables that change what torch, NCCL and the launchers do. Nothing here ever stops a run: what cannot be found
(no git, no repository, no driver) is said in the record.

A folder started again (a resumed run: hydra.run.dir=<its folder>) keeps its first record and adds
provenance-<n>.json; when the code differs from what started the folder, start() returns the one line saying how."""
from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
import re
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from framework.session.resume import PROVENANCE_FILE  # a sweep's resume command reads its command back

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # framework/
GIT_TIMEOUT_S = 20
# Environment variables that change what torch, NCCL, the thread pools and the launchers do
BEHAVIOUR_PREFIXES = ("CUDA_", "NCCL_", "TORCH", "PYTORCH_", "GLOO_", "NVIDIA_", "CUBLAS", "CUDNN_", "OMP_", "MKL_",
                      "KMP_", "OPENBLAS_", "HOROVOD_", "DS_", "SLURM_", "HYDRA_DIST_", "TF32")
BEHAVIOUR_NAMES = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                   "PYTHONHASHSEED", "PYTHONPATH", "LD_PRELOAD", "LD_LIBRARY_PATH", "CC", "CXX")
SECRET = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|KEY|CREDENTIAL", re.IGNORECASE)
OPTIONAL_ENGINES = ("deepspeed", "horovod", "hydra-core", "omegaconf", "torchmetrics", "tensorboard", "numpy",
                    "hydra-dist")
PATCH_SUFFIX = {"project": ".patch", "hydra-dist": ".hydra-dist.patch"}


@dataclass
class Provenance:
    record: dict
    patches: dict[str, bytes] = field(default_factory=dict)  # "project"/"hydra-dist" -> `git diff HEAD` (if any)

    def write(self, folder: Path, stem: str = "provenance") -> Path:
        """The record as <stem>.json, each repository's uncommitted changes beside it as <stem>[.hydra-dist].patch."""
        record = json.loads(json.dumps(self.record, default=str))
        for repo, diff in self.patches.items():
            name = stem + PATCH_SUFFIX[repo]
            (folder / name).write_bytes(diff)
            record["git"][repo]["patch"] = name
        path = folder / f"{stem}.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(record, indent=2))
        os.replace(tmp, path)
        return path


def collect(argv: list[str], overrides: list[str], project_dir: Path, config_dir: str | None = None) -> Provenance:
    """Everything above, now. project_dir: where the user's code is (their --config-dir, else the current folder)."""
    started = time.perf_counter()
    packages = installed_packages()
    project, project_diff = git_state(project_dir)
    own, own_diff = _hydra_dist_state(project, packages.get("hydra-dist"))
    patches = {name: diff for name, diff in (("project", project_diff), ("hydra-dist", own_diff)) if diff}
    record = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "git": {"project": project, "hydra-dist": own},
        "command": {"argv": list(argv), "overrides": list(overrides), "cwd": os.getcwd(), "config_dir": config_dir,
                    "python": sys.executable},
        "versions": versions(packages),
        "host": host(),
        "gpus": gpus(),
        "env": behaviour_env(),
        "packages": packages,
    }
    record["collect_seconds"] = round(time.perf_counter() - started, 4)
    return Provenance(record, patches)


class GitUnavailable(Exception):
    pass


def _git(folder: Path, *args: str) -> bytes:
    try:
        done = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, timeout=GIT_TIMEOUT_S)
    except FileNotFoundError:
        raise GitUnavailable("git is not installed") from None
    except subprocess.TimeoutExpired:
        raise GitUnavailable(f"git {args[0]} took more than {GIT_TIMEOUT_S} s") from None
    if done.returncode != 0:
        said = done.stderr.decode(errors="replace").strip().splitlines()
        raise GitUnavailable(said[-1] if said else f"git {args[0]} failed (exit code {done.returncode})")
    return done.stdout


def git_state(folder: Path) -> tuple[dict, bytes]:
    """The repository holding folder: root, commit, branch, whether the work tree differs from the commit (the
    tracked changes as a patch, `git apply`-able; untracked files by name), or why there is none. Returns the state
    and the patch's bytes."""
    folder = Path(folder).resolve()
    try:
        root = _git(folder, "rev-parse", "--show-toplevel").decode().strip()
    except GitUnavailable as exc:
        return {"repository": None, "folder": str(folder), "why": str(exc)}, b""
    state: dict = {"repository": root}
    try:
        state["commit"] = _git(folder, "rev-parse", "HEAD").decode().strip()
        state["branch"] = _git(folder, "rev-parse", "--abbrev-ref", "HEAD").decode().strip()
        diff = _git(folder, "diff", "HEAD", "--binary")
    except GitUnavailable as exc:
        state.update(commit=None, why=f"no commit to compare with: {exc}")
        diff = b""
    try:
        untracked = [u for u in _git(Path(root), "ls-files", "--others", "--exclude-standard", "-z").decode().split("\0") if u]
    except GitUnavailable:
        untracked = []
    state.update(dirty=bool(diff), patch=None,
                 patch_sha256=hashlib.sha256(diff).hexdigest() if diff else None,
                 untracked=untracked[:200], untracked_count=len(untracked))
    return state, diff


def _hydra_dist_state(project: dict, version: str | None) -> tuple[dict, bytes]:
    """hydra-dist's own code: its checkout (unless it is the project's repository) or its installed version."""
    if any(part in ("site-packages", "dist-packages") for part in PACKAGE_DIR.parts):
        return {"repository": None, "installed": str(PACKAGE_DIR), "version": version}, b""
    try:
        root = _git(PACKAGE_DIR, "rev-parse", "--show-toplevel").decode().strip()
    except GitUnavailable as exc:
        return {"repository": None, "folder": str(PACKAGE_DIR), "why": str(exc), "version": version}, b""
    if root == project.get("repository"):
        return {"repository": root, "same_as": "project", "version": version}, b""
    state, diff = git_state(PACKAGE_DIR)
    return {**state, "version": version}, diff


def versions(packages: dict[str, str]) -> dict:
    """Versions read without importing the optional engines (importing DeepSpeed alone takes seconds)."""
    import torch  # here: Hydra builds this module's sweep callback before the driver imports torch (framework/cli.py)

    found = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
             "cudnn": None, "nccl": None}
    try:
        found["cudnn"] = torch.backends.cudnn.version()
    except Exception:  # noqa: BLE001  (a broken cuDNN install is recorded as missing, never fails a run)
        pass
    try:
        nccl = torch.cuda.nccl.version()  # the linked library's version; starts no CUDA context
        found["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
    except Exception:  # noqa: BLE001  (CPU builds of torch have no NCCL)
        pass
    found.update({name: packages.get(name) for name in OPTIONAL_ENGINES})
    return found


def installed_packages() -> dict[str, str]:
    """Every distribution on sys.path, the first of a name winning (the one imported). Read from the
    `<name>-<version>.dist-info` folder names the wheel spec prescribes (parsing every METADATA file took 0.1 s
    here); only a folder without its version in the name (an egg-info) is opened."""
    packages = {}
    for entry in sys.path:
        try:
            names = sorted(os.listdir(entry or "."))
        except OSError:
            continue
        for name in names:
            stem, _, kind = name.rpartition(".")
            if kind not in ("dist-info", "egg-info"):
                continue
            dist_name, _, version = stem.partition("-")
            if kind == "egg-info" or not version:
                meta = importlib.metadata.PathDistribution(Path(entry or ".") / name)
                dist_name, version = meta.metadata["Name"] or dist_name, meta.version
            key = re.sub(r"[-_.]+", "-", dist_name).lower()
            packages.setdefault(key, version.split("-")[0] if kind == "egg-info" else version)
    return dict(sorted(packages.items()))


def host() -> dict:
    return {"hostname": socket.gethostname(), "platform": platform.platform(), "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()}


def gpus() -> dict:
    """Every GPU of this node (NVML numbering, which CUDA_VISIBLE_DEVICES in env selects from) with its name,
    memory and driver, read through NVML or nvidia-smi so that the driver process starts no CUDA context."""
    try:
        import pynvml  # the nvml extra; optional
    except ImportError:
        pynvml = None
    if pynvml is not None:
        try:
            pynvml.nvmlInit()
            driver = pynvml.nvmlSystemGetDriverVersion()
            found = []
            for i in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                found.append({"index": i, "name": _text(pynvml.nvmlDeviceGetName(handle)),
                              "memory_mib": pynvml.nvmlDeviceGetMemoryInfo(handle).total // 2**20,
                              "uuid": _text(pynvml.nvmlDeviceGetUUID(handle)), "driver": _text(driver)})
            return {"source": "nvml", "devices": found}
        except pynvml.NVMLError as exc:
            nvml_error = f"NVML: {exc}"
    else:
        nvml_error = "nvidia-ml-py is not installed"
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,name,memory.total,uuid,driver_version",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20)
    except (FileNotFoundError, subprocess.TimeoutExpired) as exc:
        return {"source": None, "devices": [],
                "why": f"no NVIDIA driver found ({nvml_error}; nvidia-smi: {type(exc).__name__})"}
    if out.returncode != 0:
        return {"source": None, "devices": [], "why": f"nvidia-smi: {out.stderr.strip() or out.stdout.strip()}"}
    devices = []
    for line in out.stdout.strip().splitlines():
        try:
            index, name, memory, uuid, driver = [part.strip() for part in line.split(",")]
            devices.append({"index": int(index), "name": name, "memory_mib": int(memory), "uuid": uuid,
                            "driver": driver})
        except ValueError:  # a field nvidia-smi cannot give ([N/A]) or a name with a comma: kept as it came
            devices.append({"nvidia-smi": line})
    return {"source": "nvidia-smi", "devices": devices}


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def behaviour_env() -> dict[str, str]:
    return {name: value for name, value in sorted(os.environ.items())
            if (name.startswith(BEHAVIOUR_PREFIXES) or name in BEHAVIOUR_NAMES) and not SECRET.search(name)}


def code_changes(before: dict, now: dict) -> list[str]:
    """How the code of `now` differs from `before` (two records): per repository, another commit or other
    uncommitted changes; empty when the same."""
    changes = []
    for name in ("project", "hydra-dist"):
        old, new = before.get("git", {}).get(name, {}), now.get("git", {}).get(name, {})
        if old.get("same_as") or new.get("same_as"):
            continue
        where = f"{name} ({new.get('repository') or old.get('repository') or 'no repository'})"
        if old.get("commit") != new.get("commit"):
            changes.append(f"{where}: commit {_short(old.get('commit'))} -> {_short(new.get('commit'))}")
        elif old.get("patch_sha256") != new.get("patch_sha256"):
            changes.append(f"{where}: other uncommitted changes")
        elif old.get("version") != new.get("version"):
            changes.append(f"{where}: version {old.get('version')} -> {new.get('version')}")
    return changes


def _short(commit: str | None) -> str:
    return commit[:10] if commit else "none"


def record_start(folder: Path, hydra_cfg, argv: list[str]) -> str | None:
    """The record of this job (or sweep: hydra_cfg is then the sweep's) written into folder; see start()."""
    config_dir = command_line_config_dir(hydra_cfg)
    return start(folder, collect(argv, list(hydra_cfg.overrides.task), project_dir(config_dir), config_dir))


def start(folder: Path, provenance: Provenance) -> str | None:
    """Writes the record of this start into folder; a folder started before keeps its first record and gets
    provenance-<n>.json. Returns the line to say when the code differs from what first started the folder."""
    first = folder / PROVENANCE_FILE
    if not first.is_file():
        provenance.write(folder)
        return None
    n = 2
    while (folder / f"provenance-{n}.json").exists():
        n += 1
    written = provenance.write(folder, f"provenance-{n}")
    try:
        before = json.loads(first.read_text())
    except (OSError, ValueError):
        return None
    changes = code_changes(before, provenance.record)
    if not changes:
        return None
    return (f"note: the code differs from what started {folder} ({'; '.join(changes)}); "
            f"the first start's record is {first.name}, this one {written.name}")


def project_dir(config_dir: str | None) -> Path:
    """The user's project: their --config-dir, else the current folder."""
    return Path(config_dir).resolve() if config_dir else Path.cwd()


def command_line_config_dir(hydra_cfg) -> str | None:
    """The run's --config-dir, if it was given."""
    return next((source.path for source in hydra_cfg.runtime.config_sources
                 if source.provider == "command-line" and source.schema == "file"), None)


class SweepProvenance(Callback):
    """Hydra callback: the sweep folder's own provenance.json, written once before its first job."""

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        changed = record_start(sweep_dir, config.hydra, sys.argv)
        if changed:
            print(changed, flush=True)
