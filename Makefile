# Set-up and entry points. `make run` and `make test` work on a fresh Debian machine.
PYTHON ?= python3
VENV ?= .venv
BIN = $(VENV)/bin
# The benchmark tests run real torch: a CPU build, pinned here for the tests only
# (users bring their own torch, usually a CUDA build).
TORCH_VERSION = 2.13.0
# Debian packages the tests use: lspci cross-checks the sysfs fixtures; gcc builds
# the fake libnvidia-ml (tests/fake_nvml) against nvml.h from nvidia-nvml-dev;
# prometheus and promtool scrape the agent and lint its metrics and alert rules;
# prometheus-alertmanager (and its amtool) checks and runs monitoring/alertmanager.yml;
# systemd-analyze verifies the units; openssl makes a test certificate; slurmctld,
# slurmd, slurm-client and munge run the one-node Slurm cluster of tests/slurm.
DEB_PACKAGES = pciutils gcc libc6-dev prometheus prometheus-alertmanager systemd openssl \
  numactl slurmctld slurmd slurm-client munge prometheus-node-exporter

.PHONY: run demo test lint typecheck unit system-packages venv-package clean gpu

# Debian and Ubuntu ship `python3 -m venv` apart, in python3-venv (without it venv stops
# with "ensurepip is not available" and leaves a venv without pip): when venv fails, the
# half-made venv is removed and the missing package installed (or named), then it is retried.
$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV) || { rm -rf $(VENV); $(MAKE) --no-print-directory venv-package && $(PYTHON) -m venv $(VENV); }
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

venv-package:
	@version=$$($(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])'); \
	missing=$$(for p in python3-venv python$$version-venv; do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -z "$$missing" ]; then \
	  echo "$(PYTHON) -m venv failed (its message is above), although python3-venv and python$$version-venv are installed" >&2; exit 1; \
	fi; \
	echo "$(PYTHON) -m venv needs Debian's $$missing: installing it" >&2; \
	sudo=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	$$sudo apt-get update -qq && $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null \
	  || { echo "could not install $$missing: run apt-get install $$missing as root" >&2; exit 1; }

system-packages:
	@missing=$$(for p in $(DEB_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  sudo=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$sudo apt-get update -qq && $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

# torch for the benchmark tests (and for mypy, which reads its types): the CPU build,
# never PyPI's default multi-GB CUDA one. A wheel directory or index that has the
# +cpu build serves the first command; otherwise PyTorch's CPU index does.
$(BIN)/.torch: $(BIN)/.installed
	$(BIN)/pip install --quiet 'torch==$(TORCH_VERSION)+cpu' \
	  || $(BIN)/pip install --quiet --index-url https://download.pytorch.org/whl/cpu 'torch==$(TORCH_VERSION)'
	touch $@

run: $(BIN)/.installed
	$(BIN)/nodecheck agent

# docs/checks.md's example: `nodecheck check` on the faulty 8-GPU replica and the fake NVML
# (needs gcc and libc6-dev for the fake libnvidia-ml.so.1). The check exits 1 on that node
# by design, which the demo expects; the replica is built in a temporary folder and removed.
demo: $(BIN)/.installed
	$(BIN)/python -m tests.fixtures.demo --expect-status 1

lint: $(BIN)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(BIN)/.torch
	@mkdir -p .typecheck/nodecheck
	@for p in agent checks tuning; do ln -sfn ../../$$p .typecheck/nodecheck/$$p; done
	MYPYPATH=.typecheck $(BIN)/mypy .typecheck/nodecheck tests bench tools

unit: $(BIN)/.torch system-packages
	$(BIN)/pytest -q

test: lint typecheck unit

clean:
	rm -rf $(VENV) .typecheck .mypy_cache .pytest_cache .ruff_cache build *.egg-info

# On a machine with an NVIDIA GPU: pytest -m gpu, tools.gpu_side_by_side and
# bench.bench_accuracy --device cuda, one report in gpu-report/ (report.md and each
# step's log); non-zero when a step failed or could not run, 2 at once when there is no
# GPU. Not $(BIN)/.torch: that is the CPU build, which would replace a CUDA torch already
# in the venv. Bring the CUDA build for the driver (.venv/bin/pip install torch); without
# it the report says which torch it found, and the benchmark step is not run.
gpu: $(BIN)/.installed
	$(BIN)/python -m tools.gpu_report --output gpu-report
