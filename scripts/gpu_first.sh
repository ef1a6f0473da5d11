#!/usr/bin/env bash
# The first minutes of a GPU: one command, about 8 minutes on one H100 or H200 with its setup, that checks the CUDA
# paths the desk reviews found most at risk (scripts/gpu_first.py: PowerSGD's recovery from an fp16 overflow;
# ms and torch.cuda.synchronize calls per step and the peak memory at a save for ResNet-18 under none, fp16 and
# PowerSGD; fsdp's bf16 accumulation dtype; verify.py's step-1 TF32 gap), then as many of make test-gpu's one-GPU
# cells as the time leaves (scripts/gpu_smoke.py). One line per check; everything goes to one log.
#
#   bash scripts/gpu_first.sh [WHEELS]      (log: gpu_first.log, or HYDRA_DIST_GPU_FIRST_LOG)
#
# Setup, for a bare machine with a torch built for its driver and maybe no network: a venv that sees the machine's
# packages (its torch; HYDRA_DIST_VENV, default under /tmp) gets the rest of pyproject.toml's dependencies, from the
# folder WHEELS when given (pip install --no-index --find-links: Hydra is rarely on such a machine; fetch its
# wheels beforehand with `pip download hydra-core==1.3.2 omegaconf==2.3.0 antlr4-python3-runtime==4.9.3 -d WHEELS`),
# else from the index. The checks import the checkout itself (PYTHONPATH), as the tests do.
set -uo pipefail
cd "$(dirname "$0")/.."
started=$(date +%s)
deadline=$((started + ${HYDRA_DIST_GPU_FIRST_SECONDS:-470}))
log=${HYDRA_DIST_GPU_FIRST_LOG:-gpu_first.log}
exec > >(tee "$log") 2>&1
wheels=${1:-}
venv=${HYDRA_DIST_VENV:-${TMPDIR:-/tmp}/hydra-dist-gpu-first-venv}
python=${PYTHON:-python3}

if [ -n "$wheels" ] && [ ! -d "$wheels" ]; then
    echo "gpu_first: WHEELS=$wheels is not allowed: no such folder; give a folder of wheels, or nothing (the index)"
    exit 2
fi
if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv --system-site-packages "$venv" || { echo "gpu_first: setup: no venv"; exit 1; }
    # a machine whose python3 is itself a venv's (an H200's: /opt/torch/.venv) keeps its torch there, which
    # --system-site-packages does not see (it adds the base interpreter's): a .pth adds that venv's packages
    parent=$("$python" -c 'import site, sys; print(site.getsitepackages()[0] if sys.prefix != sys.base_prefix else "")')
    if [ -n "$parent" ]; then
        echo "$parent" > "$("$venv/bin/python" -c 'import site; print(site.getsitepackages()[0])')/machine-venv.pth"
    fi
fi
requirements="$venv/requirements.txt"
"$venv/bin/python" -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))' \
    > "$requirements" || { echo "gpu_first: setup: pyproject.toml's dependencies could not be read (Python >= 3.11)"; exit 1; }
if ! "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-build-isolation \
        ${wheels:+--no-index --find-links "$wheels"} -r "$requirements"; then
    echo "gpu_first: setup: pip could not install pyproject.toml's dependencies$([ -n "$wheels" ] && echo " from $wheels")"
    exit 1
fi
echo "gpu_first: setup done in $(( $(date +%s) - started )) s ($venv)"

PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" "$venv/bin/python" scripts/gpu_first.py "$deadline"
code=$?
echo "gpu_first: $([ $code = 0 ] && echo "every check ok" || echo "FAILED (exit $code)") in $(( $(date +%s) - started )) s; log: $log"
exit $code
