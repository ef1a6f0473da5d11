#!/usr/bin/env bash
# Sets up what a run (`core`), the GPU tests (`gpu-tests`) or the tests and every engine (`all`, the default) need;
# idempotent, and quick the second time.   bash scripts/setup.sh [core|gpu-tests|all]
#   1. a virtual environment in .venv (override with HYDRA_DIST_VENV)
#   2. the project and its pinned dependency ranges (pyproject.toml), installed editable; `gpu-tests` and `all` add
#      the test and mlflow extras (pytest, the Hydra launcher and sweeper plugins; MLflow for logger=mlflow), `all`
#      the hf and wandb extras too (transformers, datasets and timm for the models and data users bring; Weights &
#      Biases for logger=wandb)
#   3. `all` only: optional engines that need more than pip (scripts/setup.d/*.sh: Horovod, DeepSpeed)
#   4. not for `gpu-tests` (they train on dataset=synthetic): Fashion-MNIST and a public-domain text offline, Debian's
#      dataset-fashion-mnist and dict-devil when apt can install them; otherwise the first run downloads
#      Fashion-MNIST through torchvision (dataset.download=true).
# `gpu-tests` is what `make test-gpu` needs: no compiler, no CUDA toolkit, and no network once the venv is installed
# (a GPU machine may have a runtime-only CUDA and no internet); a missing engine skips its tests and cells.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${HYDRA_DIST_VENV:-.venv}
python=${PYTHON:-python3}
mode=${1:-all}
case "$mode" in
    core) extras="" packages=core ;;
    gpu-tests) extras="[test,mlflow]" packages=gpu-tests ;;
    all) extras="[test,mlflow,hf,wandb]" packages=all ;;
    *) echo "setup: mode '$mode' is not allowed: expected core, gpu-tests or all" >&2; exit 2 ;;
esac

if [ ! -x "$venv/bin/python" ]; then
    echo "setup: creating virtual environment $venv"
    "$python" -m venv "$venv"
fi

# Reinstall only when the dependency list or packaging changed since the last successful install, or when
# more is asked of a venv than it was set up for (`all` serves every mode, `gpu-tests` serves `core` too).
stamp="$venv/.hydra-dist-installed"
hash=$(cat pyproject.toml setup.py | sha256sum | cut -d' ' -f1)
have=$(cat "$stamp" 2>/dev/null || true)
served() { [ "$have" = "$hash all" ] || [ "$have" = "$hash $packages" ] || { [ "$packages" = core ] && [ "$have" = "$hash gpu-tests" ]; }; }
if ! served; then
    echo "setup: installing dependencies into $venv (torch is large: about a minute from a local wheel)"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
    # compat: the checkout itself goes on the import path, so Hydra's plugin scan (pkgutil over the hydra_plugins
    # namespace) finds hydra_plugins/hydra_dist_sweepers; setuptools' default editable finder hides it from pkgutil
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --config-settings editable_mode=compat \
        -e ".$extras" 2>&1 | grep -v "^WARNING: Location" || true
    "$venv/bin/python" -c "import torch, torchvision, hydra, tensorboard" \
        || { echo "setup: dependency install failed (see pip output above)" >&2; exit 1; }
    echo "$hash $packages" > "$stamp"
fi

if [ "$mode" = all ]; then
    for part in scripts/setup.d/*.sh; do
        [ -e "$part" ] || continue
        bash "$part" "$venv"
    done
fi

[ "$mode" = gpu-tests ] && exit 0
# Debian packages of the built-in data: Fashion-MNIST (dataset=fashion_mnist) and The Devil's Dictionary, a public
# domain text (experiment=char_lm); without apt the first run downloads Fashion-MNIST and char_lm needs dataset.path.
fmnist=/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz
devil=/usr/share/dictd/devil.dict.dz
if [ ! -f "$fmnist" ] || [ ! -f "$devil" ]; then
    if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
        echo "setup: installing Debian packages dataset-fashion-mnist and dict-devil"
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist dict-devil; } \
            >/dev/null || echo "setup: apt could not install them; runs will download Fashion-MNIST with torchvision"
    else
        echo "setup: no apt (or not root); Fashion-MNIST will be downloaded by torchvision on first run"
    fi
fi
