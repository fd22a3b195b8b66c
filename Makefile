# Two front doors: `make demo` runs the Router with the demo agents, `make test` runs the suite.
# Each one sets up what it needs (venv, package, apt tools) and is fast when that is done.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed-$(shell sha1sum pyproject.toml | cut -c1-12)

.PHONY: demo test test-fast check docs bench install clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	@rm -f $(VENV)/.installed-* && touch $@

install: $(STAMP)

demo: install
	$(BIN)/reach demo

# Three workers on two cores: the suite waits on processes, sockets and timers more than it
# computes (two workers kept the cores 60% busy). --maxschedchunk 2 hands out tests a few at a
# time, in the order tests/conftest.py sets (slowest suites first), so no worker idles at the
# end. Bytecode is written even where PYTHONDONTWRITEBYTECODE is set: otherwise each of the
# hundred-odd Router and agent processes the suite starts compiles the package from source.
PYTEST := env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m pytest -q -n 3 --maxschedchunk 2

test: install
	scripts/test-deps
	$(PYTEST)

# The core suite only: no etcd clusters, fuzzing, held-out semantic evaluation, framework bridges
# or browser, or the wheel installed into a fresh venv, or end-to-end runs of Router and agent
# processes (`make test` runs them all).
test-fast: install
	$(PYTEST) -m "not etcd and not fuzz and not semantic_eval and not integrations and not browser and not packaging and not drill and not e2e and not prometheus"

check: install
	scripts/check

# The documentation site (mkdocs.yml) into site/; --strict makes a broken link or anchor an error.
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

bench: install
	scripts/bench-deps
	$(BIN)/python bench/router_overhead.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache site
