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

# MosaicML streaming (MDS) needs numpy < 2.2 (and transformers < 5): it gets its own environment,
# where notebook 11 runs its MDS measurement as a subprocess (packlab.lab.measure.peers.mds_env).
MDS_VENV  := .venv-mds
MDS_STAMP := $(MDS_VENV)/.installed
# the requirement lists at dotted keys of pyproject.toml, space-separated
TOML_LIST = $(PYTHON) -c "import functools, sys, tomllib; t = tomllib.load(open('pyproject.toml', 'rb')); print(' '.join(r for key in sys.argv[1:] for r in functools.reduce(dict.get, key.split('.'), t)))"

.PHONY: install run test test-fast fuzz lab lint clean mds-env

install: $(STAMP) $(MDS_STAMP)

mds-env: $(MDS_STAMP)

# [tool.packlab] no_deps are installed without their declared dependencies (they would replace
# the CPU torch, or downgrade protobuf) and without the Python check (megatron-bridge declares
# >= 3.12; the packed-data modules the tests run work on 3.11).
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[torch,notebooks,test,peers]"
	$(BIN)/python -m pip install --quiet --no-deps --ignore-requires-python $$($(BIN)/python -c "import tomllib; print(' '.join(tomllib.load(open('pyproject.toml','rb'))['tool']['packlab']['no_deps']))")
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $@

# packlab's own dependencies plus [tool.packlab] mds (numpy < 2.2 wins the resolution), then
# mosaicml-streaming without its declared dependencies (they would bring torchvision and a CUDA
# torch; its image-dataset module gets a stand-in torchvision at run time). packlab itself runs
# there from the checkout (PYTHONPATH), not installed.
$(MDS_STAMP): pyproject.toml
	$(PYTHON) -m venv $(MDS_VENV)
	$(MDS_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(MDS_VENV)/bin/python -m pip install --quiet $$($(TOML_LIST) project.dependencies tool.packlab.mds)
	$(MDS_VENV)/bin/python -m pip install --quiet --no-deps $$($(TOML_LIST) tool.packlab.mds_no_deps)
	touch $@

run: $(STAMP) $(MDS_STAMP)
	$(BIN)/python -m packlab.lab.notebooks run --scale $(SCALE)

# The tests start servers (a local S3 server, Ray, torch.distributed). Where we may (root, as in
# CI), they run in a private network namespace, so nothing a test starts can be reached from
# beyond this machine's tests whatever address it binds. Its interfaces: loopback, and one veth
# pair with a private address (no route out), so Ray's test can show that Ray listens on
# 127.0.0.1 only and not on the machine's other addresses. Elsewhere, plainly.
# Two pytest workers (pytest-xdist), each test handed to whichever is free: the suite is
# CPU-bound, so on two cores two workers are all there is to gain. The suite starts hundreds of
# interpreters (commands, measured jobs, kernels): bytecode is cached, not recompiled in each.
PYTEST_WORKERS ?= -n 2 --dist worksteal
NAMESPACE_NET := ip link set lo up && ip link add packlab0 type veth peer name packlab1 \
  && ip addr add 10.254.0.1/24 dev packlab0 && ip link set packlab0 up && ip link set packlab1 up

test: $(STAMP) $(MDS_STAMP)
	@if unshare -n sh -c '$(NAMESPACE_NET)' 2>/dev/null; then \
	  echo "[packlab] tests in a private network namespace (loopback and 10.254.0.1)"; \
	  PYTHONDONTWRITEBYTECODE= unshare -n sh -c '$(NAMESPACE_NET) && exec $(BIN)/python -m pytest $(PYTEST_WORKERS) $(PYTEST_ARGS)'; \
	else \
	  PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest $(PYTEST_WORKERS) $(PYTEST_ARGS); \
	fi

# The edit loop: everything but the slow tests (notebooks, fuzzing, interrupts, real ranks,
# Ray, the S3 server's command runs, JupyterLab): 1,745 of the 1,837 tests in about 3 minutes.
test-fast: $(STAMP)
	$(MAKE) --no-print-directory test PYTEST_ARGS='-m "not slow" $(PYTEST_ARGS)'


# The long fuzz run: FUZZ_PER_FORMAT mutations of every format (tests/fuzzing.py), seeded as
# `make test`'s are (the commit checked out) unless FUZZ_SEED=... is given; the counts per
# format, class and outcome on stderr, as JSON on stdout. About 20 minutes here.
FUZZ_PER_FORMAT ?= 3000
fuzz: $(STAMP)
	PYTHONPATH=$(CURDIR):$(CURDIR)/tests $(BIN)/python tests/fuzzing.py --per-format $(FUZZ_PER_FORMAT) --json $(if $(FUZZ_SEED),--seed $(FUZZ_SEED))

lab: $(STAMP)
	$(BIN)/python -m packlab.lab.jupyter

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf build data/*/ $(VENV) $(MDS_VENV)
