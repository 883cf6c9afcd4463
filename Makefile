# The README's two commands: `make demo` and `make test`. Each creates .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test venv bench clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -c constraints.txt -e '.[torch,remote,test]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/python examples/demo.py

test: $(STAMP)
	$(BIN)/python -m pytest -n 2 -q

# The benchmarks' own extra (matplotlib for charts, the JPEG libraries compared).
$(VENV)/.installed-bench: $(STAMP)
	$(BIN)/pip install -q -c constraints.txt -e '.[torch,remote,test,bench]'
	touch $@

bench: $(VENV)/.installed-bench
	$(BIN)/python tools/bench.py

clean:
	rm -rf $(VENV) demo-data bench-data
