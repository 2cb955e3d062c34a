# SwiftSpec: `make demo` and `make test` work on a fresh machine (Python 3.10+).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# The CPU wheel of torch 2.13.0; on a GPU machine use e.g. `make TORCH_SPEC=torch install`.
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: install install-llamacpp install-ikllama demo test test-fast bench bench-check bench-kernels style clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e '.[test]'
	touch $@

install: $(STAMP)

demo: install
	$(PY) -m swiftspec.cli demo

# pytest exits 5 when it collects no test: that is not a failure of the suite.
test: install
	$(PY) -m pytest -ra; rc=$$?; if [ $$rc -eq 5 ]; then exit 0; else exit $$rc; fi

test-fast: install
	$(PY) -m pytest -m "not slow"

# `;` separates groups loaded one after another: all eight modes at once need ~20 GB. `auto` runs
# the engine --mode auto picks; the report sets it beside the fastest measured mode.
# llama.cpp peers need `make install-llamacpp` (or LLAMA_SERVER=path/to/llama-server); else skipped.
BENCH_MODES ?= ar,chain,tree,async,auto,hf-ar,hf-assisted;ar@int8,tree@int8,ar@int4,chain@int4,tree@int4,async@int4,llamacpp-ar,llamacpp-spec
bench: install
	$(PY) -m swiftspec.cli bench --modes "$(BENCH_MODES)" --prompts 10 --max-tokens 128 \
		--temperature 0 --seed 0 --warmup 1 --out bench_out --perplexity docs/bench/perplexity.txt \
		$(if $(LLAMA_SERVER),--llama-server $(LLAMA_SERVER))
	$(PY) -m swiftspec.bench.check bench_out

bench-check: install
	$(PY) -m swiftspec.cli bench --modes "ar,chain,tree;hf-ar" --prompts 2 --max-tokens 32 \
		--warmup 0 --out bench_out/check
	$(PY) -m swiftspec.bench.check bench_out/check

# llama.cpp's Python bindings, built from source for this CPU's own features (never -march=native,
# AMX off: it faults in some VMs); SWIFTSPEC_ISA=avx2 builds an AVX2-only peer on an AVX-512 host.
install-llamacpp: install
	$(PY) -m pip install -q "numpy>=1.20" "typing-extensions>=4.5" "diskcache>=5.6.1" "jinja2>=2.11.3"
	CMAKE_ARGS="$$($(PY) tools/llamacpp_cmake_args.py)" $(PY) -m pip install -q --no-cache-dir \
		--force-reinstall --no-deps llama-cpp-python

# ik_llama.cpp's llama-server (the second CPU peer), built once for this CPU into ~/.cache/swiftspec/ikllama
# (30+ minutes on 2 cores, at low priority; SWIFTSPEC_ISA=avx2 builds an AVX2-only peer as above).
install-ikllama: install
	$(PY) tools/build_ikllama.py

bench-kernels: install
	$(PY) benchmarks/kernels.py

style: install
	$(PY) -m ruff check swiftspec tests benchmarks tools
	$(PY) tools/check_style.py

clean:
	rm -rf $(VENV) bench_out .pytest_cache
