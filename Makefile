PY := .venv/bin/python
STAMP := .venv/.installed

.PHONY: install test test-long lint bench bench-quick demo docs

$(STAMP): pyproject.toml
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

# with pytest-xdist (the test extra), one worker per core, each taking whole modules (their
# module fixtures, servers and child processes stay together); without it, one process
test: $(STAMP)
	$(PY) -m pytest -q $$($(PY) -c "import xdist" 2>/dev/null && echo "-n auto --dist loadfile")

# the tests marked slow: among them 200 local and 50 S3 crash trials, 300 truncate crash trials
# (-rP prints their counts) and the model-based test at over ten times the examples
test-long: $(STAMP)
	$(PY) -m pytest -q -m slow -rP

lint: $(STAMP)
	$(PY) -m ruff check pytreestore pytreestore_zarr_*.py tests examples benchmarks
	$(PY) -m ruff format --check pytreestore pytreestore_zarr_*.py tests examples benchmarks
	$(PY) -m pyright

bench: $(BENCH_STAMP)
	$(PY) benchmarks/run.py

# small sizes, one repeat (CI); the anchors' libraries are optional: rows without them say skipped
bench-quick: $(BENCH_STAMP)
	$(PY) benchmarks/run.py --quick

demo: $(STAMP)
	$(PY) examples/simulation.py
	$(PY) examples/particles.py

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site
