# The two commands in the README are `make example` and `make test`; each sets up first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q

.PHONY: setup setup-bench conformance example test check lint bench clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# torch first and pinned: 2.13.0 is the CPU wheel; an unpinned torch pulls a CUDA build.
	$(PIP) install torch==2.13.0
	$(PIP) install -e '.[dev]'
	touch $@

# The anchors of benchmarks/conformance.py (ModelOpt AutoCast, onnxconverter-common, onnxslim), CPU only.
setup-bench: setup
	$(PIP) install -e '.[dev,bench]'

conformance: setup-bench
	$(PY) benchmarks/conformance.py

# onnxruntime-web for the Node.js client the quantize tests run (exact versions from the lock file).
clients/web/node_modules: clients/web/package-lock.json
	cd clients/web && npm ci --no-audit --no-fund
	touch $@

example: setup
	$(VENV)/bin/onnxsmith build examples/faceage/recipe.toml --out release/faceage

# Lint, layers, types: what `make test` and `make check` both run first.
lint: setup
	$(VENV)/bin/ruff check src tests tools benchmarks
	$(VENV)/bin/ruff format --check src tests tools benchmarks
	$(VENV)/bin/lint-imports  # the layers of docs/architecture.md (pyproject.toml [tool.importlinter])
	$(VENV)/bin/mypy  # strict types in the packages pyproject.toml [tool.mypy] lists

test: lint clients/web/node_modules
	tools/setup-chromium.sh
	$(PY) -m pytest -q -n 2 --dist loadfile

# The quick loop while editing (under 2 minutes: docs/benchmarks.md): lint and types, then the unit tests of
# the passes, rules and precision engine, the settings, recipes, the gate and the architecture; no real models.
CHECK_TESTS := tests/passes tests/rules tests/precision tests/test_architecture.py tests/test_settings.py \
	tests/test_recipe.py tests/test_gate.py tests/test_structured_outputs.py tests/test_symbolic_shapes.py \
	tests/test_io.py tests/test_inputs.py tests/test_sizing.py tests/test_int8_policy.py tests/test_shrink.py \
	tests/test_extract.py tests/test_fp16_storage.py tests/hostile/test_untrusted_text.py
check: lint
	$(PY) -m pytest -q -n 2 -m "not slow and not realmodel" $(CHECK_TESTS)

clean:
	rm -rf $(VENV) release .cache
