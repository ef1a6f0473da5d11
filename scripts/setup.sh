#!/usr/bin/env bash
# Sets up everything a run or the tests need; idempotent, and quick the second time.
#   1. a virtual environment in .venv (override with HYDRA_DIST_VENV)
#   2. the project and its pinned dependency ranges (pyproject.toml), installed editable
#   3. optional parts that need more than pip (scripts/setup.d/*.sh, in name order; each is idempotent)
#   4. Fashion-MNIST offline: Debian's dataset-fashion-mnist when apt can install it;
#      otherwise the first run downloads it through torchvision (dataset.download=true).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${HYDRA_DIST_VENV:-.venv}
python=${PYTHON:-python3}

if [ ! -x "$venv/bin/python" ]; then
    echo "setup: creating virtual environment $venv"
    "$python" -m venv "$venv"
fi

# Reinstall only when the dependency list or packaging changed since the last successful install.
stamp="$venv/.hydra-dist-installed"
want=$(cat pyproject.toml setup.py | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "setup: installing dependencies into $venv (torch is large: about a minute from a local wheel)"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -e ".[test]" 2>&1 | grep -v "^WARNING: Location" || true
    "$venv/bin/python" -c "import torch, torchvision, hydra, tensorboard" \
        || { echo "setup: dependency install failed (see pip output above)" >&2; exit 1; }
    echo "$want" > "$stamp"
fi

for part in scripts/setup.d/*.sh; do
    [ -e "$part" ] || continue
    bash "$part" "$venv"
done

fmnist=/usr/share/datasets/fashion-mnist
if [ ! -f "$fmnist/train-images-idx3-ubyte.gz" ]; then
    if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
        echo "setup: installing Debian package dataset-fashion-mnist"
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist; } >/dev/null \
            || echo "setup: apt could not install dataset-fashion-mnist; runs will download it with torchvision"
    else
        echo "setup: no apt (or not root); Fashion-MNIST will be downloaded by torchvision on first run"
    fi
fi
