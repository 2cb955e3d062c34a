# SwiftSpec: `make demo` and `make test` work on a fresh machine (Python 3.10+).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# The CPU wheel of torch 2.13.0; on a GPU machine use e.g. `make TORCH_SPEC=torch install`.
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: install demo test test-fast bench bench-kernels style clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e '.[test]'
	touch $@

install: $(STAMP)

demo: install
	$(PY) -m swiftspec.serve.cli demo

# pytest exits 5 when it collects no test: that is not a failure of the suite.
test: install
	$(PY) -m pytest -ra; rc=$$?; if [ $$rc -eq 5 ]; then exit 0; else exit $$rc; fi

test-fast: install
	$(PY) -m pytest -m "not slow"

bench: install
	$(PY) -m swiftspec.serve.cli bench --modes ar,chain,tree,async,hf-ar,hf-assisted,llamacpp-ar,llamacpp-spec \
		--prompts 10 --max-tokens 128 --out bench_out

bench-kernels: install
	$(PY) bench/kernels.py

style: install
	$(PY) tools/check_style.py

clean:
	rm -rf $(VENV) bench_out .pytest_cache
