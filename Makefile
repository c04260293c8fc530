# The two commands: `make demo` (tune the embedded default) and `make test` (the whole suite).
# Both set up .venv/ first (autotune + vLLM's CPU build); see scripts/setup-venv.sh.
VENV ?= .venv
PY := $(VENV)/bin/python
DEMO_MODEL := .demo/tiny-llama
# The embedded default: vLLM on the CPU serving a tiny local model, with a 128 MiB KV pool
# (16,384 tokens at 8 KiB per token), so a target of 65,536 does not fit: vLLM fits the ceiling in
# one boot (--max-model-len auto) and autotune verifies it.
DEMO_TARGET ?= 65536
DEMO_SERVE := $(PY) -m vllm.entrypoints.openai.api_server --model $(DEMO_MODEL) --dtype bfloat16 \
	--enforce-eager --max-num-seqs 1 --kv-cache-memory-bytes 128M

.PHONY: setup demo test test-fast test-all bench bench-fleet clean-demo

setup: $(VENV)/.autotune-setup

$(VENV)/.autotune-setup: pyproject.toml scripts/setup-venv.sh
	VENV=$(VENV) bash scripts/setup-venv.sh

$(DEMO_MODEL)/config.json: | setup
	$(PY) -m autotune.testing.tiny_model $(DEMO_MODEL)

demo: setup $(DEMO_MODEL)/config.json
	$(VENV)/bin/autotune --target $(DEMO_TARGET) -- $(DEMO_SERVE)

# Every run prints its slowest tests (over 1 s); pytest-timeout bounds each test (pyproject.toml).
DURATIONS := --durations=30 --durations-min=1
# The fast tests: two pytest-xdist workers per core, as much of their time is spent waiting on the
# processes they start (the replaying vLLM, autotune itself). Each module runs whole on one worker
# (the modules that ask the installed vLLM share one: tests/conftest.py), the modules marked
# `long(seconds)` handed out first, the longest first.
FAST_WORKERS ?= $(shell echo $$(( 2 * $$(nproc) )))
FAST := -m "not slow and not vllm" --ignore=tests/e2e -q -n $(FAST_WORKERS) --dist loadfile --no-loadscope-reorder

# Everything but the 100k-example fuzz run (marked slow): the tests that boot no real vLLM as
# test-fast runs them, then the real vLLM boots (tests/e2e/): two modules at a time, the longest
# first (a boot leaves a core idle for part of its minute; three at a time measured slower), then
# the two modules marked `alone`, side by side but apart from the others' boots: the stall
# watchdog's trial times vLLM's silences, the fleet on Ray starts a cluster (and boots one real
# vLLM leaf). E2E_WORKERS=0 runs all in one process.
E2E_WORKERS ?= 2
test: setup
	$(PY) -m pytest $(FAST) $(DURATIONS)
	$(PY) -m pytest tests/e2e -m "not slow and not alone" -ra -n $(E2E_WORKERS) --dist loadfile --no-loadscope-reorder $(DURATIONS)
	$(PY) -m pytest tests/e2e -m "not slow and alone" -ra -n $(E2E_WORKERS) --dist loadfile $(DURATIONS)

# The inner loop: every test that boots no real vLLM (real boots live under tests/e2e/).
test-fast: setup
	$(PY) -m pytest $(FAST) $(DURATIONS)

test-all: setup
	$(PY) -m pytest -ra $(DURATIONS)

# Side by side on the embedded default: bare auto boot, autotune auto/refusal, naive bisection;
# and a 100 MB log parse. Writes bench/RESULTS.md (about 30 minutes on 2 cores with 3 repetitions).
BENCH_REPS ?= 3
bench: setup $(DEMO_MODEL)/config.json
	$(PY) bench/run_bench.py --reps $(BENCH_REPS)

# The fleet against serial tunes: 8 leaves of the replaying vLLM on 4 slots, side by side with the
# same 8 tunes one after another (a few minutes); writes the Fleet section of bench/RESULTS.md.
bench-fleet: setup
	$(PY) bench/fleet_bench.py --reps $(BENCH_REPS)

clean-demo:
	rm -rf $(DEMO_MODEL)
