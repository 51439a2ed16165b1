PY := .venv/bin/python
STAMP := .venv/.installed

.PHONY: install test test-long lint bench bench-quick bench-tpu demo docs chromium docs-images

# the direct reader's compiled loop is built by the install (pyproject.toml, ext-modules):
# a change to its C file installs again
$(STAMP): pyproject.toml pytreestore/backends/_tensorstore/_pieces.c
	test -d .venv || python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[test,dev]"
	touch $(STAMP)

DOCS_STAMP := .venv/.installed-docs

$(DOCS_STAMP): $(STAMP)
	$(PY) -m pip install -q -e ".[docs]"
	touch $(DOCS_STAMP)

BENCH_STAMP := .venv/.installed-bench

$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install -q -e ".[bench]"
	touch $(BENCH_STAMP)

install: $(STAMP)

# The tests run with their temporary files in memory (TMPDIR in /dev/shm, where the machine has
# it; removed after the run): a store's writes are fsynced, and on a disk the suite spent a fifth
# of its time waiting for them (5:17 against 6:44 on a 2-core machine). They run with
# bytecode cached even where the environment says PYTHONDONTWRITEBYTECODE: the suite starts
# about a hundred Python processes, and each would compile pytreestore again.
# JAX's compilation cache is on, in that folder, for every compile (however small or quick):
# test processes and their children compile the same small programs again and again, and a
# second compile of one is a read of the first (the point reads' module: 56 s of CPU, 48 s).
IN_MEMORY = tmp=$$(mktemp -d /dev/shm/pts.XXXXXX 2>/dev/null || mktemp -d) && \
	trap 'rm -rf "$$tmp"' EXIT && TMPDIR=$$tmp PYTHONDONTWRITEBYTECODE= \
	JAX_COMPILATION_CACHE_DIR=$$tmp/jax-cache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 \
	JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=0

# with pytest-xdist (the test extra), one worker per core, each taking whole modules (their
# module fixtures, servers and child processes stay together; the Ray modules as one, sharing
# one Ray: tests/conftest.py), longest first (tests/durations.py; xdist would otherwise reorder
# them by their count of tests); without it, one process
XDIST = -n auto --dist loadfile --no-loadscope-reorder
test: $(STAMP) chromium
	@$(IN_MEMORY) $(PY) -m pytest -q $$($(PY) -c "import xdist" 2>/dev/null && echo "$(XDIST)")

# Chromium for the notebook view's browser tests (tests/browser.py; about 70 MB from the npm
# registry, once, into $$PYTREESTORE_CHROMIUM or .venv/chromium). Offline, the fetch fails
# without failing make test: those tests then skip, naming the command.
chromium: $(STAMP)
	@$(PY) tests/browser.py fetch >/dev/null || echo "Chromium not fetched (offline?): the browser tests will skip"

# the notebook view's screenshots in the docs (docs/images/notebook-view-light.png, -dark.png)
docs-images: chromium
	$(PY) tests/browser.py screenshots

# the tests marked slow: among them 200 local and 50 S3 crash trials, 300 truncate crash trials
# (-rP prints their counts), the model-based test at over ten times the examples, and the
# cells of the kinds x backends grids that make test leaves out (tests/conftest.py: tiered);
# on one worker per core, as make test
test-long: $(STAMP)
	@$(IN_MEMORY) $(PY) -m pytest -q -m slow -rP $$($(PY) -c "import xdist" 2>/dev/null && echo "$(XDIST)")

lint: $(STAMP)
	$(PY) -m ruff check pytreestore pytreestore_zarr_*.py tests examples benchmarks
	$(PY) -m ruff format --check pytreestore pytreestore_zarr_*.py tests examples benchmarks
	$(PY) -m pyright

bench: $(BENCH_STAMP)
	$(PY) benchmarks/run.py

# small sizes, one repeat (CI); the anchors' libraries are optional: rows without them say skipped
bench-quick: $(BENCH_STAMP)
	$(PY) benchmarks/run.py --quick
	$(PY) benchmarks/tpu_feed.py --quick
	$(PY) benchmarks/host_reads.py --mib 16

# feeding an accelerator (issue 34): run on the accelerator's host, alone (it holds the chip)
bench-tpu: $(BENCH_STAMP)
	$(PY) benchmarks/tpu_feed.py --json bench-tpu.json
	$(PY) benchmarks/host_reads.py

demo: $(STAMP)
	$(PY) examples/simulation.py
	$(PY) examples/particles.py

# the site, built strictly (every link and anchor checked); then the API reference's test
# (tests/test_api_docs.py: every public name rendered, no private one), which needs the docs
# extra and skips in `make test` where it is not installed
docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site
	$(PY) -m pytest -q -p no:cacheprovider tests/test_api_docs.py
