#!/usr/bin/env bash
# Optional part: DeepSpeed (strategy=deepspeed) in the venv given as $1, with the version range of
# pyproject.toml's `deepspeed` extra. Idempotent: does nothing when deepspeed is already installed.
# PyPI ships DeepSpeed only as a source distribution whose build imports torch, so it is built
# with --no-build-isolation against the torch already in the venv (about 30 s; no CUDA ops are
# compiled now). At first use on CPU DeepSpeed compiles a small shared-memory op with g++ and ninja
# (about a minute, cached under ~/.cache/torch_extensions), so both are checked here.
# Skip this part with HYDRA_DIST_SKIP_DEEPSPEED=1.
set -euo pipefail
venv=${1:?usage: 20-deepspeed.sh VENV}
py="$venv/bin/python"

if [ "${HYDRA_DIST_SKIP_DEEPSPEED:-0}" = 1 ]; then
    echo "setup: skipping DeepSpeed (HYDRA_DIST_SKIP_DEEPSPEED=1); strategy=deepspeed will not be available"
    exit 0
fi
# The communication op DeepSpeed compiles at its first use, compiled now (about a minute, once: cached under
# ~/.cache/torch_extensions), so a user's first run, or the first test under its timeout, does not pay for it.
build_comm_op() {
    "$py" -c "from deepspeed.comm.torch import build_shm_op; build_shm_op()" >/dev/null 2>&1 \
        || echo "setup: warning: DeepSpeed's communication op did not build now; it builds at first use" >&2
}
# Installed already: done (find_spec, not an import: importing DeepSpeed takes seconds).
if "$py" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('deepspeed') is None)" 2>/dev/null; then
    build_comm_op
    exit 0
fi
for tool in g++ ninja; do
    if ! command -v "$tool" >/dev/null; then
        echo "setup: DeepSpeed needs $tool (it compiles its CPU communication op at first use); install it, e.g." \
             "'apt-get install g++ ninja-build', then run 'make setup' again" >&2
        exit 1
    fi
done
spec=$(sed -n 's/^deepspeed = \["\([^"]*\)"\]$/\1/p' pyproject.toml)
spec=${spec:-deepspeed}
echo "setup: installing $spec into $venv (source build against the installed torch, about 30 s)"
# DS_BUILD_OPS=0: compile nothing now; DeepSpeed builds the ops it needs at first use.
DS_BUILD_OPS=0 "$py" -m pip install --quiet --disable-pip-version-check --no-build-isolation "$spec" 2>&1 \
    | grep -v "^WARNING: Location" || true
"$py" -c "import deepspeed" >/dev/null 2>&1 \
    || { echo "setup: DeepSpeed install failed (see pip output above)" >&2; exit 1; }
build_comm_op
echo "setup: DeepSpeed $("$py" -c "import importlib.metadata as m; print(m.version('deepspeed'))") installed"
