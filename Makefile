# The two commands of README.md: `make demo` and `make test`. Both build .venv on first use.
comma := ,
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Extras installed into .venv. torch, when an extra needs it, is installed pinned first: an unpinned
# torch requirement pulls a multi-GB CUDA build.
EXTRAS ?= test
TORCH_PIN := torch==2.13.0
NEEDS_TORCH := $(if $(filter torch all test hf,$(subst $(comma), ,$(EXTRAS))),yes,)
ARGS ?=
# make test runs the suite on every core (pytest-xdist); TEST_WORKERS=0 runs it in one process
TEST_WORKERS ?= auto

.PHONY: demo test bench docs venv clean

venv: $(VENV)/.installed-$(subst $(comma),-,$(EXTRAS))

$(VENV)/.installed-$(subst $(comma),-,$(EXTRAS)): pyproject.toml setup.py loader/_native/_gather.c loader/_native/_plan.c loader/_native/_plan_rows.c loader/_native/_plan_order.c loader/_native/_plan.h Makefile
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "babelfeed needs Python >= 3.11, $(PYTHON) is " + sys.version.split()[0])'
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@if [ -n "$(NEEDS_TORCH)" ]; then $(BIN)/python -m pip install --quiet --disable-pip-version-check "$(TORCH_PIN)"; fi
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e ".[$(EXTRAS)]"
	@touch $@

demo: venv
	$(BIN)/babelfeed demo --config configs/demo.py $(ARGS)

test: venv
	$(BIN)/python -m pytest -n $(TEST_WORKERS) $(ARGS)

# docs/config.md, the config key reference, is written from babelfeed/config/spec.py (a test holds it to the spec)
docs: venv
	$(BIN)/python -c "from babelfeed.config.spec import markdown; print(markdown(), end='')" > docs/config.md

bench: venv
	$(BIN)/python benchmarks/run_all.py $(ARGS)

clean:
	rm -rf build .pytest_cache .hypothesis
