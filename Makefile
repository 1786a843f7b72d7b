# Two commands do everything on a fresh machine with only python3:
#   make run    execute every notebook at the default scale and write the report (build/report/)
#   make test   run the test suite (includes every notebook at CI scale through papermill)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
SCALE  ?= default
export MPLCONFIGDIR := $(CURDIR)/build/mpl
export HF_HOME      := $(CURDIR)/build/hf
export RAY_AUTH_MODE := disabled

.PHONY: install run test lab lint clean

install: $(STAMP)

# [tool.packlab] no_deps are installed without their declared dependencies (they would replace
# the CPU torch) and without the Python check (megatron-bridge declares >= 3.12; the packed-data
# modules the tests run work on 3.11).
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[torch,notebooks,test]"
	$(BIN)/python -m pip install --quiet --no-deps --ignore-requires-python $$($(BIN)/python -c "import tomllib; print(' '.join(tomllib.load(open('pyproject.toml','rb'))['tool']['packlab']['no_deps']))")
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $@

run: $(STAMP)
	$(BIN)/python -m packlab.notebooks run --scale $(SCALE)

# The tests start servers (a local S3 server, Ray, torch.distributed). Where we may (root, as in
# CI), they run in a private network namespace whose only interface is loopback, so nothing a
# test starts can listen beyond 127.0.0.1 whatever address it binds; elsewhere, plainly.
test: $(STAMP)
	@if unshare -n sh -c 'ip link set lo up' 2>/dev/null; then \
	  echo "[packlab] tests in a loopback-only network namespace"; \
	  unshare -n sh -c 'ip link set lo up && exec $(BIN)/python -m pytest $(PYTEST_ARGS)'; \
	else \
	  $(BIN)/python -m pytest $(PYTEST_ARGS); \
	fi

lab: $(STAMP)
	$(BIN)/python -m packlab.lab

lint: $(STAMP)
	$(BIN)/ruff check packlab tests

clean:
	rm -rf build data/*/ $(VENV)
