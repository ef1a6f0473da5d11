"""What this machine offers a run: `hydra-dist-devices [overrides]` or `python -m framework.devices [overrides]`.

Prints the visible GPUs (index, name, total and free memory, utilization, driver and CUDA versions), or
on a machine without GPUs the CPU facts; then what each strategy would start here, as the strategies
themselves describe it for the composed config (overrides such as trainer.accelerator=cpu or
strategy.nproc_per_node=4 change the plan the same way they would change a run). `--config-dir DIR` adds a
user's config dir, as for train.py: its strategies are listed too (their package must be on PYTHONPATH)."""
from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from hydra.errors import HydraException

import framework.config  # noqa: F401  (registers the config schemas Hydra composes with)
from framework.config.hydra_versions import version_base
from framework.config.settings import settings_of
from framework.common.errors import ConfigError
from framework.common.paths import CONF_DIR, config_dir_override, overrides_and_config_dir
from framework.session.detect import detect
from framework.session.environment import Ranks, cpu_cores
from framework.session.situations import refuse
from framework.config.targets import TargetAllowlist, allowing
from framework.strategies import build_strategy, resolve_auto, strategy_class, strategy_names
from framework.telemetry.gpu_monitor import GIB, GpuMonitor, nvml_status


def gpu_table() -> list[str]:
    count = torch.cuda.device_count()
    if count == 0:
        return [f"GPUs: none visible (torch.cuda.is_available() is {torch.cuda.is_available()})"]
    nvml_ok, why = nvml_status()
    utilization = {r.index: r.util_percent for r in GpuMonitor(list(range(count))).read()}
    rows = [("index", "name", "memory total", "memory free", "utilization")]
    for i in range(count):
        free, total = torch.cuda.mem_get_info(i)
        util = f"{utilization[i]:.0f} %" if i in utilization else "n/a"
        rows.append((str(i), torch.cuda.get_device_name(i), f"{total / GIB:.1f} GiB", f"{free / GIB:.1f} GiB", util))
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    lines = [f"GPUs: {count} visible"] + ["  " + "  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
    lines.append(f"NVIDIA driver {driver_version() or 'unknown'} | CUDA driver API {cuda_driver_version() or 'unknown'} | "
                 f"torch {torch.__version__} built for CUDA {torch.version.cuda}")
    if not nvml_ok:
        lines.append(f"utilization needs NVML: {why}")
    return lines


def driver_version() -> str | None:
    if nvml_status()[0]:
        import pynvml  # an optional package (the nvml extra)

        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else version
    try:  # Linux's NVIDIA kernel module says it too: "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15 ..."
        words = Path("/proc/driver/nvidia/version").read_text().split()
        return next(w for w in words if w[0].isdigit() and w.count(".") >= 1)
    except (OSError, StopIteration):
        return None


def cuda_driver_version() -> str | None:
    if not nvml_status()[0]:
        return None
    import pynvml  # an optional package (the nvml extra)

    v = pynvml.nvmlSystemGetCudaDriverVersion()  # e.g. 12040
    return f"{v // 1000}.{v % 1000 // 10}"


def cpu_facts() -> list[str]:
    model = platform.processor() or platform.machine()
    try:
        model = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("model name")) or model
    except (OSError, StopIteration):
        pass
    memory = ""
    try:
        info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line)
        kib = {k: int(v.split()[0]) for k, v in info.items() if k in ("MemTotal", "MemAvailable")}
        memory = f" | memory {kib['MemTotal'] / 2**20:.1f} GiB total, {kib['MemAvailable'] / 2**20:.1f} GiB available"
    except (OSError, KeyError, ValueError):
        pass
    return [f"CPU: {model} | {cpu_cores()} core(s) usable by this process (of {os.cpu_count()}){memory}",
            f"torch {torch.__version__} ({'CUDA ' + torch.version.cuda if torch.version.cuda else 'CPU-only'} build), "
            f"{torch.get_num_threads()} intra-op thread(s) per process"]


def strategy_plan(overrides: list[str], config_dir: str | None, ranks: Ranks | None) -> list[str]:
    """Each strategy's own account of what it would start here, for the config these overrides compose.
    Only the strategy named in the overrides when there is one (its own options may be overridden too).
    config_dir: a user's config dir (as train.py's --config-dir), whose strategies are listed too. ranks: those
    another program started this process among (None: nobody did), which each strategy is built with."""
    chosen = [o.split("=", 1)[1] for o in overrides if o.startswith("strategy=")]
    lines = ["What each strategy would start here:"]
    names = set()
    if config_dir:
        overrides = [*overrides, config_dir_override(config_dir)]
        names = {p.stem for p in (Path(config_dir) / "strategy").glob("*.yaml")}
    with initialize_config_dir(config_dir=str(CONF_DIR), **version_base()):
        for name in chosen[-1:] or ["auto", *sorted(names.union(strategy_names()) - {"auto"})]:
            cfg = compose("config", overrides=[*overrides, f"strategy={name}"])
            try:
                note = resolve_auto(cfg, outer_kind=None).removeprefix("strategy=auto ")
                with allowing(TargetAllowlist.of_command(cfg)):  # the config this command composed
                    settings = settings_of(cfg, strategy_class(cfg.strategy).Options)
                    strategy = build_strategy(settings.strategy, settings.trainer, ranks)
                strategy.validate()
                plan = f"{note}: {strategy.starter.describe()}" if note else strategy.starter.describe()
            except ConfigError as exc:
                plan = f"not usable here: {exc}"
            lines.append(f"  strategy={name:<7} {plan}")
    return lines


def report(overrides: list[str], config_dir: str | None, ranks: Ranks | None) -> str:
    lines = gpu_table() if torch.cuda.device_count() else gpu_table() + cpu_facts()
    return "\n".join(lines + strategy_plan(overrides, config_dir, ranks))


def main() -> None:
    args = sys.argv[1:]
    if any(a in ("-h", "--help") for a in args):
        print(__doc__)
        return
    try:
        session = detect()
        print(report(*overrides_and_config_dir(args, "hydra-dist-devices"), session.ranks))
    except (ConfigError, HydraException) as exc:  # a bad override: Hydra's own message, without the traceback
        refuse(ConfigError(exc))


if __name__ == "__main__":
    main()
