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

# Megatron-Bridge 0.6.2 declares Python >=3.12,<3.13: its interop tests (tests/bridge/) run in
# .venv-bridge, on a Python 3.12 found here (BRIDGE_PYTHON=... names one), with Bridge's
# declared requirements ([tool.packlab] bridge*: what is left out, and why, is there).
BRIDGE_VENV  := .venv-bridge
BRIDGE_STAMP := $(BRIDGE_VENV)/.installed
BRIDGE_TESTS := tests/bridge
BRIDGE_PYTHON_VERSION := $(shell $(PYTHON) -c "import tomllib; print(tomllib.load(open('pyproject.toml', 'rb'))['tool']['packlab']['bridge_python'])")
BRIDGE_PYTHON ?= $(shell p=$$(pyenv prefix $(BRIDGE_PYTHON_VERSION) 2>/dev/null) \
  && echo "$$p/bin/python$(BRIDGE_PYTHON_VERSION)" \
  || python$(BRIDGE_PYTHON_VERSION) -c 'import sys; print(sys.executable)' 2>/dev/null)

.PHONY: install run test test-fast fuzz lab lint clean mds-env bridge-env

install: $(STAMP) $(MDS_STAMP) $(BRIDGE_STAMP)

mds-env: $(MDS_STAMP)

bridge-env: $(BRIDGE_STAMP)

# [tool.packlab] no_deps are installed without their declared dependencies (they would replace
# the CPU torch, or downgrade protobuf).
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[torch,notebooks,test,peers]"
	$(BIN)/python -m pip install --quiet --no-deps $$($(TOML_LIST) tool.packlab.no_deps)
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

# bridge_no_deps first, without their dependencies (Bridge's include a CUDA-kernel source build
# no CPU machine can make); then one resolution of packlab's dependencies, `bridge` and what
# tests/bridge/stack.py reads Bridge and its megatron-core extras to declare, less
# bridge_left_out. torch there is the registry's CUDA build with its CUDA libraries (GBs; pip's
# cache keeps them): no CPU build of torch 2.13.0 for Python 3.12 is served. packlab itself
# runs there from the checkout (PYTHONPATH), not installed.
$(BRIDGE_STAMP): pyproject.toml tests/bridge/stack.py
	@if ! "$(BRIDGE_PYTHON)" -c "import sys; sys.exit(f'{sys.version_info[0]}.{sys.version_info[1]}' != '$(BRIDGE_PYTHON_VERSION)')" 2>/dev/null; then \
	  echo "[packlab] $(BRIDGE_VENV) needs Python $(BRIDGE_PYTHON_VERSION) (Megatron-Bridge 0.6.2 declares >=3.12,<3.13); none here (tried: $(or $(BRIDGE_PYTHON),pyenv prefix $(BRIDGE_PYTHON_VERSION) and python$(BRIDGE_PYTHON_VERSION))): install one, or name it with BRIDGE_PYTHON=/path/to/python$(BRIDGE_PYTHON_VERSION)" >&2; \
	  exit 1; \
	fi
	"$(BRIDGE_PYTHON)" -m venv $(BRIDGE_VENV)
	$(BRIDGE_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(BRIDGE_VENV)/bin/python -m pip install --quiet --no-deps packaging $$($(TOML_LIST) tool.packlab.bridge_no_deps)
	$(BRIDGE_VENV)/bin/python tests/bridge/stack.py > $(BRIDGE_VENV)/declared.txt
	$(BRIDGE_VENV)/bin/python -m pip install --quiet $$($(TOML_LIST) project.dependencies tool.packlab.bridge) -r $(BRIDGE_VENV)/declared.txt
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

# Two pytest runs at once, both whatever the other gives (make test fails if either does): the
# suite in .venv on PYTEST_WORKERS (PYTEST_ARGS), and beside it BRIDGE_TESTS in .venv-bridge with
# packlab from the checkout (BRIDGE_PYTEST_ARGS), in one process at a lower priority: most of
# its time is importing Bridge (tens of CPU-seconds a process), which a worker of its own would pay
# again, and the suite leaves a core idle a quarter of its time (waits on servers, children,
# sampling). Its output is kept in BRIDGE_LOG and printed after the suite's, and it is stopped
# if the suite is interrupted. PYTEST_SELECT goes to both.
BRIDGE_LOG := build/test-bridge.log
TEST_RUNS = mkdir -p build; \
  PYTHONPATH=$(CURDIR) nice -n 5 $(BRIDGE_VENV)/bin/python -m pytest $(PYTEST_SELECT) \
  $(BRIDGE_TESTS) $(BRIDGE_PYTEST_ARGS) > $(BRIDGE_LOG) 2>&1 & bridge_run=$$!; \
  trap "kill $$bridge_run 2>/dev/null" INT TERM; \
  $(BIN)/python -m pytest $(PYTEST_WORKERS) $(PYTEST_SELECT) $(PYTEST_ARGS); suite=$$?; \
  wait $$bridge_run; bridge=$$?; echo "[packlab] $(BRIDGE_TESTS) in $(BRIDGE_VENV), beside the suite:"; \
  cat $(BRIDGE_LOG); exit $$(( suite ? suite : bridge ))

test: $(STAMP) $(MDS_STAMP) $(BRIDGE_STAMP)
	@if unshare -n sh -c '$(NAMESPACE_NET)' 2>/dev/null; then \
	  echo "[packlab] tests in a private network namespace (loopback and 10.254.0.1)"; \
	  PYTHONDONTWRITEBYTECODE= unshare -n sh -c '$(NAMESPACE_NET) && $(TEST_RUNS)'; \
	else \
	  PYTHONDONTWRITEBYTECODE= sh -c '$(TEST_RUNS)'; \
	fi

# The edit loop: everything but the slow tests (notebooks, fuzzing, interrupts, real ranks,
# Ray, the S3 server's command runs, JupyterLab): 1,837 of the 1,950 tests (71 of them in
# .venv-bridge).
test-fast: $(STAMP) $(BRIDGE_STAMP)
	$(MAKE) --no-print-directory test PYTEST_SELECT='-m "not slow"'


# The long fuzz run: FUZZ_PER_FORMAT mutations of every format (tests/fuzzing.py), seeded as
# `make test`'s are (the commit checked out) unless FUZZ_SEED=... is given; the counts per
# format, class and outcome on stderr, as JSON on stdout. 2 to 9 minutes a format here, beside
# other jobs.
FUZZ_PER_FORMAT ?= 3000
fuzz: $(STAMP)
	PYTHONPATH=$(CURDIR):$(CURDIR)/tests $(BIN)/python tests/fuzzing.py --per-format $(FUZZ_PER_FORMAT) --json $(if $(FUZZ_SEED),--seed $(FUZZ_SEED))

lab: $(STAMP)
	$(BIN)/python -m packlab.lab.jupyter

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf build data/*/ $(VENV) $(MDS_VENV)
