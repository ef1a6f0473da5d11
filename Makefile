# The two commands of the README. Each sets up what it needs first (idempotent, quick when done):
# train only the core (torch, torchvision, Hydra, TensorBoard, the dataset); test everything, engines included.
.PHONY: setup setup-all setup-core setup-gpu-tests train test test-all test-hydra14 test-gpu
PY := .venv/bin/python

setup setup-all:
	bash scripts/setup.sh all

setup-core:
	bash scripts/setup.sh core

setup-gpu-tests:
	bash scripts/setup.sh gpu-tests

train: setup-core
	$(PY) train.py $(ARGS)

# Two test files at a time (pytest-xdist; a file's tests stay together, so its module fixtures run once), the
# heaviest files first (tests/conftest.py orders them by tests/support/file_weights.json; xdist keeps that order).
XDIST := -n 2 --dist loadfile --no-loadscope-reorder

# Every in-process test, the distributed units, and the first real run of every engine, launcher and launch situation
# (tests marked core); then the in-process tests again against Hydra 1.4. About 7.5 minutes on 2 cores after setup
# (docs/testing.md).
test: setup
	$(PY) -m pytest $(XDIST) -m "not slow or core" --durations=15 $(PYTEST_ARGS)
	$(MAKE) test-hydra14

# Everything (what CI runs): every process test too. About 50 minutes on 2 cores.
test-all: setup
	$(PY) -m pytest $(XDIST) --durations=25 $(PYTEST_ARGS)
	$(MAKE) test-hydra14

# The in-process tests (not those tests/conftest.py marks slow: they start processes) against Hydra 1.4 and its
# OmegaConf, installed into $(HYDRA14) beside the venv's 1.3 and put first on PYTHONPATH. Hydra's warnings that a
# _target_ was built without an execution whitelist are errors here: every component goes through ours.
HYDRA14 := .hydra14
HYDRA14_PINS := hydra-core==1.4.0rc3 omegaconf==2.4.1rc1
test-hydra14: setup
	@grep -qxF "$(HYDRA14_PINS)" $(HYDRA14)/.pins 2>/dev/null || { rm -rf $(HYDRA14) && \
		$(PY) -m pip install --quiet --disable-pip-version-check --target $(HYDRA14) --no-deps $(HYDRA14_PINS) && \
		echo "$(HYDRA14_PINS)" > $(HYDRA14)/.pins; }
	PYTHONPATH=$(CURDIR)/$(HYDRA14) $(PY) -m pytest -m "not slow" -n 2 --dist loadfile \
		-W "error:hydra.utils.instantiate() resolved:UserWarning" \
		-W "error:Hydra configured Python logging without an execution whitelist:UserWarning" $(PYTEST_ARGS)

# On a GPU machine: the gpu-marked tests plus every strategy x precision, killed and resumed (scripts/gpu_smoke.py).
# It needs the core and the test tools only (no engine build: nvcc and the network may be missing there); an engine
# `make setup` did not install skips its tests and cells with one line.
test-gpu: setup-gpu-tests
	$(PY) scripts/gpu_smoke.py
