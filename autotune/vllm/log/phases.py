"""The phases of a vLLM boot, read from its log lines (pure): what the live status line shows.

phase_of says which phase a line starts, advance how phases move, starting_step which step
of the long "starting" phase a line shows. The line patterns cite docs/log-formats.md; the
live line itself (cli/phases.py ``BootPhases``, cli/progress.py) only presents them.
"""

from __future__ import annotations

import re

from autotune.vllm.log import failures
from autotune.vllm.log.clean import clean_line

STARTING = "starting"
LOADING = "loading weights"
PROFILING = "profiling/compiling"
KV_SIZED = "KV cache sized"
GRAPHS = "capturing graphs"
READY = "ready"
REFUSED = "refused"
FAILED = "failed"

# A boot goes through these in order; REFUSED and FAILED end it.
PHASE_ORDER = (STARTING, LOADING, PROFILING, KV_SIZED, GRAPHS, READY)
TERMINAL_PHASES = (REFUSED, FAILED)

# Long configuration dumps that name every feature ("cudagraph_capture_sizes", "torch.compile"
# options): they say only that the engine is starting, whatever words they contain.
# vLLM 0.6-0.14 "vLLM API server version X"; 0.15+ logo "... version 0.32.0" or, with
# VLLM_DISABLE_LOG_LOGO=1, "vLLM server version X, serving model M"; 0.9+ "non-default args: {...}";
# <=0.8.5 "args: Namespace(...)"; V0 "Initializing an LLM engine (v0.6.1)", V1 "Initializing a V1 LLM engine".
_STARTING_RE = re.compile(
    r"vLLM (?:API )?server version \S|non-default args: \{|\bargs: Namespace\("
    r"|Initializing an? (?:V[01] )?LLM engine|[█▄▀].*\bversion\s+\S+\s*$"
)

# Checked in this order on the cleaned line; the first match wins. Versions from
# docs/log-formats.md (sections 3, 5, 8, 9) and our own vLLM 0.32 CPU boots.
_PHASE_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    # 0.7.3+ "Starting vLLM API server on http://..." / 0.9.1+ "Starting vLLM API server 0 on ..." /
    # 0.18+ "Starting vLLM server on ..."; uvicorn "Uvicorn running on" (<=0.7.2) and
    # "Application startup complete." (all versions).
    (READY, re.compile(r"Starting vLLM (?:API )?server(?: \d+)? on \S|Uvicorn running on \S"
                       r"|Application startup complete")),
    # V1 tqdm bars "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 40%|..." (0.10+),
    # older "Capturing CUDA graph shapes", V0 "Capturing cudagraphs for decoding" and
    # "Capturing the model for CUDA graphs"; then "Graph capturing finished in N secs, took X GiB"
    # and 0.20+ "CUDA graph pool memory: X GiB (actual)".
    (GRAPHS, re.compile(r"Capturing (?:CUDA graph|cudagraph|the model for CUDA graphs)"
                        r"|Graph capturing finished|CUDA graph pool memory|CUDA graphs can take additional")),
    # The KV pool is known: V1 0.9.1+ "Available KV cache memory: X GiB" (also before a refusal),
    # V1 0.8+ "GPU KV cache size: N tokens" (CPU "CPU KV cache size" after 0.21), V0 "# GPU blocks: N" /
    # "# CUDA blocks: N" / "# cuda blocks: N", V0 0.6.5-0.10 "the rest of the memory reserved for KV
    # Cache is X GiB", V0 0.6.4 "kv_cache_size=X GiB", CPU 0.20+ "Auto set (X/Y) GiB for KV cache" /
    # "Explicitly set (X/Y) GiB for KV cache", 0.14+ "Auto-fit max_model_len: reduced from A to B",
    # 0.10.2+ "reserved X GiB memory for KV Cache as specified by kv_cache_memory_bytes".
    (KV_SIZED, re.compile(r"KV cache size: [\d,]+ tokens|Available KV cache memory"
                          r"|(?:Auto|Explicitly) set \([\d.]+/[\d.]+\) GiB for KV cache|# \w+ blocks: \d"
                          r"|memory reserved for KV Cache is|\bkv_cache_size=[\d.]+ ?GiB"
                          r"|Auto-fit max_model_len: (?:reduced|full)|memory for KV Cache as specified")),
    # Weights are in; profiling / torch.compile / warm-up run until the KV pool is sized:
    # 0.8+ "Model loading took X GiB", <=0.7.3 "Loading model weights took X GB", 0.8+ loader
    # "Loading weights took N seconds", V0 "Memory profiling takes", torch.compile lines
    # ("Dynamo bytecode transform time", "Compiling a graph for dynamic shape", "torch.compile takes
    # N s in total", "Using cache directory: ... for vLLM's torch.compile"; not 0.32's config-time
    # "Enforce eager set, disabling torch.compile"), CPU "Warming up model for the
    # compilation", "Initial profiling/warmup run took", 0.18+ "Profiling CUDA graph memory",
    # "Estimated CUDA graph memory", "CUDA graph memory profiling is enabled".
    (PROFILING, re.compile(r"Model loading took|Loading model weights took|Loading weights took"
                           r"|Memory profiling|torch\.compile takes|for vLLM's torch\.compile|Dynamo bytecode transform|Compiling a graph"
                           r"|Warming up model|profiling/warmup run|Profiling CUDA graph memory"
                           r"|Estimated CUDA graph memory|CUDA graph memory profiling|saved AOT compiled")),
    # Weights being read: "Starting to load model M..." (V1 GPU and CPU runners), the tqdm bars
    # "Loading safetensors checkpoint shards: 40% Completed", "Loading pt checkpoint shards",
    # 0.32 "Filesystem type for checkpoints", downloads from the Hub.
    (LOADING, re.compile(r"Starting to load model|Loading (?:safetensors|pt|gguf) checkpoint shards"
                         r"|Loading weights (?:on|from)|Filesystem type for checkpoints|Initializing model took"
                         r"|Downloading (?:model|weights|shards)|No model\.safetensors\.index\.json")),
)


def phase_of(line: str) -> str | None:
    """The boot phase a vLLM log line starts, or None when the line says nothing about it.

    Phases, in boot order: "starting", "loading weights", "profiling/compiling",
    "KV cache sized", "capturing graphs", "ready"; a boot ends "refused" (vLLM's KV-cache
    refusal, V1 or V0 wording) or "failed" (any other fatal entry of the failure catalog).
    The line may carry any prefix, ANSI colour and a trailing carriage return.
    """
    text = clean_line(line)
    if not text.strip():
        return None
    if _STARTING_RE.search(text):
        return STARTING
    found = failures.search(text)
    if found is not None:
        kind = found[0]
        if kind.kind in failures.REFUSAL_KINDS:
            return REFUSED
        if kind.fatal:
            return FAILED
    for phase, pattern in _PHASE_RULES:
        if pattern.search(text):
            return phase
    return None


def advance(current: str, new: str | None) -> str:
    """The phase after seeing ``new`` while in ``current``: phases only move forward (worker
    processes interleave their lines), a refusal beats a generic failure (vLLM logs
    "EngineCore failed to start" before the refusal's own line), and nothing leaves refused."""
    if new is None or new == current:
        return current
    if current == REFUSED:
        return current
    if new in TERMINAL_PHASES:
        return new
    if current == FAILED:
        return current
    if PHASE_ORDER.index(new) > PHASE_ORDER.index(current):
        return new
    return current


# What the long "starting" phase is waiting for, in order: vLLM's API server process logs its
# banner and arguments, spawns the engine core ("Initializing a V1 LLM engine", V0 "Initializing
# an LLM engine"), which spawns the workers ("world_size=1 rank=0", "(Worker pid=N)",
# "(Worker_TP0 pid=N)", "(VllmWorker rank=0 pid=N)"). On a busy machine each step costs seconds
# of Python imports with no output.
STARTING_STEPS = ("importing vLLM", "API server", "engine core", "workers")
_STARTING_STEP_RULES = (
    ("workers", re.compile(r"\bworld_size=\d+ rank=\d+|\((?:Vllm)?Worker[\w -]*pid=\d+\)")),
    ("engine core", re.compile(r"Initializing an? (?:V[01] )?LLM engine|\(EngineCore[\w]* pid=\d+\)")),
    ("API server", re.compile(r"vLLM (?:API )?server version|non-default args: |\bargs: Namespace\(|\(APIServer pid=\d+\)"
                              r"|[█▄▀].*\bversion\s+\S+\s*$")),
)


def starting_step(line: str) -> str | None:
    """Which step of the "starting" phase a log line shows (see STARTING_STEPS), or None."""
    text = clean_line(line)
    for step, pattern in _STARTING_STEP_RULES:
        if pattern.search(text):
            return step
    return None


# Why a boot goes silent in each phase, and what to do: the "hung" verdict's cause and fix (the stall
# watchdog stopped a boot that printed nothing for --stall-timeout seconds).
_STALLS = {
    None: ("the command printed nothing at all in {idle}: it never reached vLLM's first line (a container "
           "pulling its image, a wrapper script waiting for input, Python importing from a slow or network "
           "filesystem)",
           "run the serve command by hand to see where it waits; if it is only slow to start, raise "
           "--stall-timeout"),
    "importing vLLM": ("the command printed {last} and then nothing in {idle}, no line of vLLM's engine yet: "
                       "still importing (torch, CUDA libraries) from a slow or network filesystem, or waiting "
                       "for a lock or for input",
                       "run the serve command by hand to see where it waits; on a slow disk raise --stall-timeout"),
    "workers": ("vLLM was starting its workers and printed nothing in {idle}: with several GPUs the workers wait "
                "for each other to set up NCCL (a GPU held by another process, peer-to-peer or shared memory "
                "that does not work, a firewall between nodes)",
                "rerun with NCCL_DEBUG=INFO to see where NCCL waits; check the GPUs are free (`autotune gpus`); "
                "in a container give it --ipc=host (or a larger --shm-size); try NCCL_P2P_DISABLE=1"),
    STARTING: ("vLLM was starting (its {step} step) and printed nothing in {idle}",
               "run the serve command by hand to see where it waits; if this machine is only slow, raise "
               "--stall-timeout"),
    LOADING: ("vLLM was loading the weights and printed nothing in {idle}: a slow download from the Hugging Face "
              "Hub, a network disk, or a large checkpoint read without a progress bar",
              "download the model first (`hf download REPO`) or point --model at a local copy on a fast disk; "
              "or raise --stall-timeout"),
    PROFILING: ("vLLM was profiling / compiling (torch.compile) and printed nothing in {idle}: a first compile of "
                "a large model can run silent for many minutes",
                "raise --stall-timeout (the next boot reuses the compile cache, ~/.cache/vllm), or pass "
                "--enforce-eager to compile nothing (slower serving)"),
    KV_SIZED: ("vLLM had sized its KV cache and printed nothing in {idle}: it was warming up or capturing CUDA "
               "graphs", "raise --stall-timeout, or pass --enforce-eager to skip graph capture (slower serving)"),
    GRAPHS: ("vLLM was capturing CUDA graphs and printed nothing in {idle}",
             "raise --stall-timeout, or pass --enforce-eager to skip graph capture (slower serving)"),
    READY: ("vLLM said its server was starting and then printed nothing in {idle}",
            "run the serve command by hand and ask its /health; raise --stall-timeout if it is only slow"),
    FAILED: ("vLLM failed and its processes did not exit: nothing printed in {idle} after {last}",
             "the failure is the cause: `autotune parse` on the log names it, with its fix"),
}
_STALLS[REFUSED] = _STALLS[FAILED]


def stall_diagnosis(lines: list[str], idle_s: float | None = None) -> dict:
    """The cause and fix of a boot the stall watchdog stopped, from the lines it printed (its log, or the
    end of it): the phase it stood in (and the step of a long start), or that it printed nothing."""
    phase, step, last = None, None, ""
    for line in lines:
        if line.strip():
            last = clean_line(line).strip()
            phase = advance(phase or STARTING, phase_of(line))
            step = starting_step(line) or step
    key = None if not last else (step or "importing vLLM") if phase == STARTING and step in (None, "workers") else phase
    cause, fix = _STALLS.get(key, _STALLS[STARTING])
    idle = f"{idle_s:,.0f} s" if isinstance(idle_s, (int, float)) else "--stall-timeout seconds"
    shown = last if len(last) <= 120 else last[:117] + "..."
    return {"cause": cause.format(idle=idle, step=step or "first", last=f"'{shown}'"), "fix": fix}
