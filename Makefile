# The two commands of the README: `make demo` runs the bundled example end to end,
# `make test` runs the test suite. Both create the virtualenv when it is missing.
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
# A local CPU build of torch lies on these machines; elsewhere pick the build you want,
# e.g. `make test TORCH_SPEC=torch` (an unpinned torch may pull a multi-GB CUDA build).
TORCH_SPEC ?= torch==2.13.0
PYTEST_ARGS ?=
# pytest-xdist on every core. --dist loadfile keeps a file's tests on one worker, so a
# module-scoped fixture (an exported model, a built release, the hostile-input children
# started together) is built once. PYTEST_ARGS comes after and can override it
# (PYTEST_ARGS="-n 0" runs in one process).
PYTEST_XDIST ?= -n auto --dist loadfile

.PHONY: demo test test-fast lint bench venv clean

$(VENV)/.installed: pyproject.toml setup.py agent/_boxkernel.c
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	# setuptools prints an informational notice on every editable install (not about this
	# project: tests/project/test_packaging.py builds the wheel with warnings on and finds none).
	PYTHONWARNINGS=ignore $(PY) -m pip install --quiet -e '.[offline,demo,dev]'
	touch $@

venv: $(VENV)/.installed

demo: $(VENV)/.installed
	$(VENV)/bin/boxwatch demo

# tools/typecheck.py: mypy with pyproject's [tool.mypy] settings, over the installed layout.
test: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) tools/typecheck.py
	$(PY) -m pytest $(PYTEST_XDIST) $(PYTEST_ARGS)

# The edit loop: no lint, no slow or integration tests (about 1-2 min on 2 cores).
test-fast: $(VENV)/.installed
	$(PY) -m pytest $(PYTEST_XDIST) -m "not slow and not integration" $(PYTEST_ARGS)

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) tools/typecheck.py

bench: $(VENV)/.installed
	@for b in bench/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done
	@echo "== bench/detection.py --unseen"; $(PY) bench/detection.py --unseen
	@echo "== bench/detection.py --tabular"; $(PY) bench/detection.py --tabular
	@echo "== bench/detection.py --fresh"; $(PY) bench/detection.py --fresh

clean:
	rm -rf $(VENV) build *.egg-info demo-out test-artifacts agent/*.so
