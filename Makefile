# The two README commands. `make pipeline` installs and runs the main job; `make test` installs and runs the tests.
PY ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv

# requirements/ray.lock.txt: the optional Ray extra (`score --engine ray`); requirements/faiss.lock.txt: the optional
# FAISS extra (`export --index faiss`); their tests skip without them
$(VENV)/.installed: requirements/cpu.lock.txt requirements/test.lock.txt requirements/ray.lock.txt requirements/faiss.lock.txt pyproject.toml
	$(PY) -m venv $(VENV)
	$(VENV)/bin/pip install -q --no-deps -r requirements/cpu.lock.txt -r requirements/test.lock.txt -r requirements/ray.lock.txt \
		-r requirements/faiss.lock.txt
	$(VENV)/bin/pip install -q --no-deps --no-build-isolation -e .
	touch $@

install: $(VENV)/.installed

pipeline: install
	$(VENV)/bin/recsys-alibi pipeline --config configs/default.yaml

test: install
	$(VENV)/bin/python -m pytest

.PHONY: install pipeline test
