PY := .venv/bin/python
STAMP := .venv/.installed

.PHONY: install test lint bench demo

$(STAMP): pyproject.toml
	test -d .venv || python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[test,dev]"
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q

lint: $(STAMP)
	$(PY) -m ruff check pytreestore tests examples benchmarks
	$(PY) -m ruff format --check pytreestore tests examples benchmarks
	$(PY) -m pyright

bench: $(STAMP)
	$(PY) benchmarks/run.py

demo: $(STAMP)
	$(PY) examples/simulation.py
