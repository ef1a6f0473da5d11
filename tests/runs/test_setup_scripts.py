"""The setup scripts' decisions, run for real with stub tools: scripts/setup.d/10-horovod.sh on a CUDA machine (no
compiler runs; a stub python answers the script's questions about torch and records how `pip wheel` was called)."""
import os
import subprocess
from pathlib import Path

import pytest

from support.processes import REPO

HOROVOD = REPO / "scripts" / "setup.d" / "10-horovod.sh"

# The venv's python as the script calls it: `-c <code>` questions about torch and horovod (told apart by the code's
# text), and `-m pip ...`. `pip wheel` writes down its environment and leaves a wheel; `pip install <wheel>` makes
# horovod "installed".
STUB_PYTHON = r"""#!/usr/bin/env bash
here=$(dirname "$0")
if [ "$1" = -c ]; then
    case "$2" in
        *"v('horovod')"*) [ -e "$here/horovod-installed" ] && echo "2.14.1+cu130 0.28.1" && exit 0; exit 1 ;;
        *"import horovod.torch as hvd"*) echo "setup: horovod: ready: stub"; exit 0 ;;
        *"import horovod.torch"*) exit 1 ;;
        *torch.utils.cmake_prefix_path*) echo "2.14.1+cu130 13.0 cp311 $STUB_TORCH/share/cmake"; exit 0 ;;
        *get_device_capability*) echo "$STUB_GPU_CC"; exit 0 ;;
        *nvidia.nccl*) echo "$STUB_NCCL"; exit 0 ;;
    esac
    echo "stub python: unexpected code: $2" >&2; exit 3
fi
if [ "$1 $2" = "-m pip" ]; then
    shift 2
    [ "$1" = --disable-pip-version-check ] && shift
    case "$1" in
        wheel)
            env > "$here/pip-wheel.env"
            while [ $# -gt 0 ] && [ "$1" != -w ]; do shift; done
            touch "$2/horovod-0.28.1-cp311-cp311-linux_x86_64.whl"; exit 0 ;;
        install) case "$*" in *.whl*) touch "$here/horovod-installed" ;; esac; exit 0 ;;
    esac
fi
echo "stub python: unexpected call: $*" >&2; exit 3
"""


def _stub(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)


@pytest.mark.parametrize("gpu_cc,nccl", [("90", True), ("", False)])
def test_horovod_is_built_with_nccl_where_a_gpu_is_visible(tmp_path, gpu_cc, nccl):
    """The script once compared the flavour with `cuda-nccl` after the flavour had become `cuda-nccl-cc<list>`: NCCL
    never reached the build, and strategy=horovod was refused on every GPU machine (hvd.nccl_built() false)."""
    venv = tmp_path / "venv"
    _stub(venv / "bin" / "python", STUB_PYTHON)
    tools = tmp_path / "tools"
    for tool in ("g++", "cmake", "make"):
        _stub(tools / tool, "#!/bin/sh\nexit 0\n")
    _stub(tmp_path / "cuda" / "bin" / "nvcc", "#!/bin/sh\nexit 0\n")
    (tmp_path / "torch" / "include" / "ATen").mkdir(parents=True)
    (tmp_path / "torch" / "include" / "ATen" / "ATen.h").write_text("#if __cplusplus < 202002L\n#error C++20\n#endif\n")
    sdist = tmp_path / "cache" / "sdist" / "horovod-0.28.1.tar.gz"
    sdist.parent.mkdir(parents=True)
    sdist.write_bytes(b"")  # cached: nothing is downloaded
    env = {**os.environ, "PATH": f"{tools}{os.pathsep}{os.environ['PATH']}", "CUDA_HOME": str(tmp_path / "cuda"),
           "HYDRA_DIST_CACHE": str(tmp_path / "cache"), "STUB_TORCH": str(tmp_path / "torch"),
           "STUB_GPU_CC": gpu_cc, "STUB_NCCL": str(tmp_path / "nccl")}
    for name in ("HYDRA_DIST_HOROVOD", "HYDRA_DIST_HOROVOD_NCCL", "HOROVOD_BUILD_CUDA_CC_LIST"):
        env.pop(name, None)
    proc = subprocess.run(["bash", str(HOROVOD), str(venv)], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = (venv / "bin" / "pip-wheel.env").read_text().splitlines()
    built = dict(line.split("=", 1) for line in lines if "=" in line)
    assert built["HOROVOD_BUILD_CUDA_CC_LIST"] == (gpu_cc or "80") and built["HYDRA_DIST_CXX_STD"] == "20"
    if nccl:
        assert built.get("HOROVOD_GPU_OPERATIONS") == "NCCL", proc.stdout
        assert built["HOROVOD_NCCL_HOME"] == str(tmp_path / "cache" / "nccl-2.14.1+cu130")
        assert "(cuda-nccl-cc90, C++20)" in proc.stdout
    else:  # no GPU to build NCCL operations for (HYDRA_DIST_HOROVOD_NCCL=1 asks for them anyway)
        assert "HOROVOD_GPU_OPERATIONS" not in built and "(cuda, C++20)" in proc.stdout


def test_make_test_gpu_sets_up_no_engine_and_reaches_no_network(tmp_path):
    """On a GPU machine with a runtime-only CUDA (no nvcc) and no internet, `make setup` stops at horovod's build:
    `make test-gpu` sets up only what the GPU tests need. With the venv installed, that asks pip, the engine scripts
    and apt nothing (a stub python that refuses every call, a stub apt-get that records any)."""
    # as a top-level make (under `make test` the environment would make this a sub-make with its own chatter)
    plain = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS", "MAKEOVERRIDES")}
    steps = subprocess.run(["make", "--no-print-directory", "-n", "test-gpu"], cwd=REPO, env=plain,
                           capture_output=True, text=True, timeout=30).stdout
    assert steps.split("\n")[:2] == ["bash scripts/setup.sh gpu-tests", ".venv/bin/python scripts/gpu_smoke.py"]
    venv = tmp_path / "venv"
    _stub(venv / "bin" / "python", "#!/bin/sh\necho \"stub python: called: $*\" >&2\nexit 3\n")
    digest = subprocess.run("cat pyproject.toml setup.py | sha256sum | cut -d' ' -f1", shell=True, cwd=REPO,
                            capture_output=True, text=True, check=True).stdout.strip()
    (venv / ".hydra-dist-installed").write_text(f"{digest} all\n")  # installed before, as `make setup` leaves it
    tools = tmp_path / "tools"
    _stub(tools / "apt-get", f"#!/bin/sh\necho \"$*\" >> {tmp_path / 'apt-calls'}\n")
    env = {**os.environ, "HYDRA_DIST_VENV": str(venv), "PATH": f"{tools}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run(["bash", str(REPO / "scripts" / "setup.sh"), "gpu-tests"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0 and "stub python" not in proc.stderr, proc.stdout + proc.stderr
    assert not (tmp_path / "apt-calls").exists()
