# The two README commands. `make pipeline` installs and runs the main job; `make test` installs and runs the tests.
PY ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv

# GPU=1: the CUDA lock instead of the CPU one (`make install GPU=1`, docs/install.md): torch 2.13.0's CUDA build
# with the matching fbgemm-gpu for torchrec. The default, and CI (.ci/run), is the CPU lock.
# CUDA_LOCK: a lock of another CUDA build (docs/install.md); PIP_INDEX_ARGS: extra pip flags for where its
# packages come from (e.g. --extra-index-url and the address of the PyTorch CUDA index); the shipped locks need none.
GPU ?=
CUDA_LOCK ?= requirements/cuda.lock.txt
PIP_INDEX_ARGS ?=
TORCH_LOCK := $(if $(GPU),$(CUDA_LOCK),requirements/cpu.lock.txt)
INSTALLED := $(VENV)/.installed$(if $(GPU),-cuda,)
OTHER_INSTALLED := $(VENV)/.installed$(if $(GPU),,-cuda)
OTHER_FBGEMM := $(if $(GPU),fbgemm-gpu-cpu,fbgemm-gpu)

# requirements/ray.lock.txt: the optional Ray extra (`score --engine ray`); requirements/faiss.lock.txt: the optional
# FAISS extra (`export --index faiss`); their tests skip without them. The CPU and CUDA builds of fbgemm ship the same
# fbgemm_gpu folder: the other build is removed first, so a venv can switch between the two locks.
$(INSTALLED): $(TORCH_LOCK) requirements/test.lock.txt requirements/ray.lock.txt requirements/faiss.lock.txt pyproject.toml
	$(PY) -m venv $(VENV)
	$(VENV)/bin/pip uninstall -qq -y $(OTHER_FBGEMM)
	$(VENV)/bin/pip install -q --no-deps $(PIP_INDEX_ARGS) -r $(TORCH_LOCK) -r requirements/test.lock.txt \
		-r requirements/ray.lock.txt -r requirements/faiss.lock.txt
	$(VENV)/bin/pip install -q --no-deps --no-build-isolation -e .
	rm -f $(OTHER_INSTALLED)
	touch $@

install: $(INSTALLED)

pipeline: install
	$(VENV)/bin/recsys-alibi pipeline --config configs/default.yaml

# TEST_WORKERS: pytest-xdist processes; each test file stays on one worker (its module fixtures start once)
TEST_WORKERS ?= 2

test: install
	$(VENV)/bin/python -m pytest -n $(TEST_WORKERS) --dist loadfile

.PHONY: install pipeline test
