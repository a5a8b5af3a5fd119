# The two commands of README.md: `make demo` and `make test`. Both build .venv on first use.
comma := ,
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# What each command installs into .venv on first use. The demo needs jax, flax and babel only; the tests need every
# extra (ray, transformers, grain, moto...); the docs need mkdocs. EXTRAS=a,b installs those extras for any target.
# torch, when an extra needs it, is installed pinned first: an unpinned torch requirement pulls a multi-GB CUDA build.
EXTRAS ?=
DEMO_EXTRAS := $(or $(EXTRAS),demo)
TEST_EXTRAS := $(or $(EXTRAS),test)
DOCS_EXTRAS := $(or $(EXTRAS),docs)
TORCH_PIN := torch==2.13.0
stamp = $(VENV)/.installed-$(subst $(comma),-,$(1))
ARGS ?=
# make test runs the suite on every core (pytest-xdist; an idle worker takes tests queued for the other, so a few
# long tests at the end do not leave a core idle); TEST_WORKERS=0 runs it in one process
TEST_WORKERS ?= auto

.PHONY: demo test bench docs venv clean

venv: $(call stamp,$(TEST_EXTRAS))

$(VENV)/.installed-%: pyproject.toml setup.py loader/_native/_gather.c loader/_native/_plan.c loader/_native/_plan_rows.c loader/_native/_plan_order.c loader/_native/_plan_copies.c loader/_native/_plan.h Makefile
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "babelfeed needs Python >= 3.11, $(PYTHON) is " + sys.version.split()[0])'
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@if [ -n "$(filter torch all test hf,$(subst -, ,$*))" ]; then $(BIN)/python -m pip install --quiet --disable-pip-version-check "$(TORCH_PIN)"; fi
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e ".[$(subst -,$(comma),$*)]"
	@touch $@

demo: $(call stamp,$(DEMO_EXTRAS))
	$(BIN)/babelfeed demo --config configs/demo.py $(ARGS)

test: $(call stamp,$(TEST_EXTRAS))
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist worksteal $(ARGS)

# The documentation site, into site/: the generated reference pages are written first (docs/reference/config.md
# from loader/config/spec.py, docs/reference/cli.md from the command's parser; tests hold both to their
# sources), then mkdocs builds with every warning an error (a broken link or anchor, a page out of the nav).
docs: $(call stamp,$(DOCS_EXTRAS))
	$(BIN)/python -c "from babelfeed.config.spec import markdown; print(markdown(), end='')" > docs/reference/config.md
	$(BIN)/python -c "from babelfeed.tools.cli import reference_markdown; print(reference_markdown(), end='')" > docs/reference/cli.md
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict --quiet
	@echo "site/index.html: the documentation site"

bench: $(call stamp,$(TEST_EXTRAS))
	$(BIN)/python benchmarks/run_all.py $(ARGS)

clean:
	rm -rf build .pytest_cache .hypothesis
