"""The wording of vLLM's boot log: one regex per message, with the versions that print it.

Formats are documented in ``log-formats.md`` (vLLM 0.6 -> 0.33). Every regex is used with
``search`` on vLLM's message (see ``clean.message_start``), never anchored with ``^``.
All are ASCII-only (``(?a)``): a figure is written in ASCII digits, and a Unicode digit next
to one makes it no figure. NUM is a number as printed, INT an integer that may carry
thousands separators.
"""

from __future__ import annotations

import functools
import importlib
import re
import sys
from collections.abc import Iterable
from typing import Any

from autotune.vllm.log.wording import Either, Fig, Maybe, Re, Wording


def _re(pattern: str, flags: int = 0) -> re.Pattern[str]:
    return re.compile(pattern, flags | re.ASCII)


NUM = r"-?[0-9]+(?:\.[0-9]+)?"
# Thousands separators only in whole groups: "42,832" and "42832", never "4,28,32" or "1,2,3,4".
INT = r"(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(?![0-9,]*[0-9])"

# Version. 0.6-0.14: "vLLM API server version X"; 0.15+ with VLLM_DISABLE_LOG_LOGO=1:
# "vLLM server version X, serving model M".
SERVER_VERSION_RE = _re(r"vLLM (?:API )?server version ([\w.+\-]{1,64})")
# 0.15+ logo banner: " ▄▄ ▄█ █     █     █ ▀▄▀ █  version 0.18.0". Only taken when the
# text before "version" holds the logo's block characters.
LOGO_VERSION_RE = _re(r"\bversion\s+([\w.+\-]{1,64})[\s`]*$")
LOGO_CHARS = ("█", "▄", "▀")
# V0 "Initializing an LLM engine (v0.6.1) with config", V1 "Initializing a V1 LLM engine (v0.8.1)".
ENGINE_VERSION_RE = _re(r"Initializing an? (?:V[01] )?LLM engine \(v([^)\s]{1,64})\)")
MAX_SEQ_LEN_RE = _re(r"\bmax_seq_len=(\d+),")  # a comma follows in every version's config
# Settings the engine config line shows as it resolved them (V1 0.8+): what a flag left to vLLM became.
ENGINE_CONFIG_FLAG_RE = _re(r"\b(enable_prefix_caching|enable_chunked_prefill)=(True|False)\b")
ENGINE_LOAD_FORMAT_RE = _re(r"\bload_format=([A-Za-z0-9_.-]+),")

# Arguments. 0.9+: "non-default args: {...}" (a dict repr); <=0.8.5: "args: Namespace(...)".
NON_DEFAULT_ARGS = "non-default args: "
NAMESPACE_ARGS = "args: Namespace("
# 0.9.2+ (verified 0.10.2+): the resolved length ("auto" -> the derived maximum).
MAX_MODEL_LEN_RESOLVED_RE = _re(r"Using max model len (\d+)")

# Attention backend. 0.12+: "Using FLASH_ATTN attention backend out of potential backends: ...".
BACKEND_STRONG_RE = _re(r"Using (\w+) attention backend out of potential backends")
# V0 "Using XFormers backend.", V1 0.7-0.10 "Using Flash Attention backend on V1 engine.",
# 0.11+ "Using FLASH_ATTN backend." or a forced enum "Using AttentionBackendEnum.FLASH_ATTN backend.".
# The trailing period is required: "[mxfp4.py:165] Using Triton backend" is a MoE kernel line.
BACKEND_GENERIC_RE = _re(
    r"\bUsing ([A-Za-z_][\w .\-]{0,60}?) backend(?: on V1 engine)?(?:\.|\s+by default\b)"
)
# Words that mark a kernel/other-component backend, not the attention backend.
NOT_ATTENTION_RE = _re(r"(?i)moe|gemm|kernel|sampl|quant|fp8|fp4|linear|reduce|lora|vit\b")
FALLBACK_FA2_RE = _re(r"Cannot use FlashAttention-2 backend for [^.\n]{1,200}\.")
FALLBACK_FA_VERSION_RE = _re(r"Cannot use FA version \d+ is not supported due to [^\n]{1,300}")

# Weights. V0/V1 <=0.7.3 "Loading model weights took 14.9888 GB"; 0.8.0-0.8.2
# "Model loading took X GB and Ys"; 0.8.3+ GiB; 0.11.1+ "GiB memory and".
WEIGHTS = Wording(Either(("Loading model weights", "Model loading")), " took ", Fig(NUM), " ",
                  Either(("GiB", "GB"), capture=True), Re(r"\b"))

# KV sizing. V1 0.8.0+ "GPU KV cache size: 42,832 tokens" (CPU backend prints "GPU" too up to
# 0.21); after 0.21 one line "CPU KV cache size: N tokens, Maximum concurrency for ...".
KV_TOKENS = Wording(Maybe((Re(r"\b"), Fig(r"GPU \+ host|[A-Z]{2,6}"), " ")), "KV cache size: ", Fig(INT), " tokens")
# V0 0.6.3+ and V1 0.7.1+ (V1 with commas from 0.8.0).
CONCURRENCY = Wording("Maximum concurrency for ", Fig(INT), " tokens per request: ", Fig(NUM), "x")
# V0 "# GPU blocks: N, # CPU blocks: M" (<=0.6), "# CUDA blocks: ..." (0.7+, dispatch key;
# some builds print it lowercase), V1 0.7 "# GPU blocks: N", V0 CPU "# CPU blocks: N"
# (<=0.6, the KV pool) and "# CPU blocks: N, # CPU blocks: 0" (0.7-0.9 CPU).
BLOCKS_RE = _re(r"# (\w{1,16}) blocks: (\d+)(?:, # CPU blocks: (\d+))?")
# V1 0.9.1+ (before a refusal too).
AVAILABLE_KV = Wording("Available KV cache memory: ", Fig(NUM), " GiB")
# V0 0.6.4 only: "Memory profiling results: ... kv_cache_size=2.89GiB ...".
V0_KV_CACHE_SIZE = Wording("kv_cache_size=", Fig(NUM), Re(" ?"), "GiB")
# V0 0.6.5-0.10 multi-line profile: "... the rest of the memory reserved for KV Cache is 5.23GiB."
V0_KV_RESERVED = Wording("the rest of the memory reserved for KV Cache is ", Fig(NUM), Re(" ?"), "GiB")
# CPU backend 0.20+: "Auto set (X/Y) GiB for KV cache on node 0, with R GiB requested memory
# for the worker. N GiB memory was consumed by non-kv usages." / "Explicitly set (X/Y) GiB ...".
CPU_KV_SET = Wording(
    Either(("Auto", "Explicitly")), " set (", Fig(NUM), "/", Fig(NUM), ") GiB for KV cache on node ", Re(r"\d+"),
    Maybe((", with ", Fig(NUM), " GiB requested memory for the worker. ", Fig(NUM),
           " GiB memory was consumed by non-kv usages")),
)
# CPU backend 0.13-0.19 "VLLM_CPU_KVCACHE_SPACE not set. Using 31.5 GiB for KV cache." and
# <=0.12 "... VLLM_CPU_KVCACHE_SPACE (GiB) for CPU backend is not set, using 4 by default."
CPU_KVCACHE_SPACE = Wording("VLLM_CPU_KVCACHE_SPACE not set. Using ", Fig(NUM), " GiB for KV cache")
CPU_KVCACHE_SPACE_DEFAULT = Wording(Maybe(("Environment variable ",)), "VLLM_CPU_KVCACHE_SPACE (", Either(("GiB", "Gi")),
                                    ") for CPU backend is not set, using ", Fig(NUM), " by default")

# Auto-fit, 0.14+ ("... (5.23 GiB available for KV cache)"; after 0.21 "... memory (5.1 GiB GPU)").
AUTOFIT_REDUCED = Wording("Auto-fit max_model_len: reduced from ", Fig(r"\d+"), " to ", Fig(r"\d+"), " to fit")
AUTOFIT_FULL = Wording("Auto-fit max_model_len: full model context length ", Fig(r"\d+"), " fits")
AUTOFIT_ATTN_FREE_RE = _re(r"Auto-fit max_model_len: attention-free model, using derived max_model_len=(\d+)")
# 0.34 (vllm/v1/core/kv_cache_planning.py _auto_fit_max_model_len): under the extensible KV cache the
# first fit is tentative ("...; the final length is set after CUDA graph capture and warmup"); the final
# length is "--max-model-len auto reduced max_model_len from %d to %d (%s)." (a WARNING below 8,192
# tokens, then "Requests longer than %d tokens will be rejected. ...") or, where the tentative length
# still fits, "Auto-fit max_model_len: using max_model_len=%d, which fits in the KV cache memory left
# after CUDA graph capture and warmup (%s)." The non-extensible path (and 0.34's CPU) logs the first form.
AUTOFIT_TENTATIVE = "; the final length is set after CUDA graph capture and warmup"
AUTOFIT_FINAL = Wording("--max-model-len auto reduced max_model_len from ", Fig(r"\d+"), " to ", Fig(r"\d+"), " (")
AUTOFIT_USING = Wording("Auto-fit max_model_len: using max_model_len=", Fig(r"\d+"), ", which fits")
AUTOFIT_SHORT = "Requests longer than "  # the WARNING form's second sentence (AUTO_FIT_SHORT_MAX_MODEL_LEN)

# The extensible KV cache, 0.34+ (vllm/v1/worker/extensible_kv_cache.py measure_kv_cache_blocks and
# extend_kv_cache; vllm/v1/executor/abstract.py disable_extensible_kv_cache; vllm/config/vllm.py
# _resolve_extensible_kv_cache). "Available KV cache memory" is then an upper bound; the pool is here:
# "Memory after warmup: %s GiB free, %s GiB committed to the KV cache, %s GiB kept for transient
# activations (%s GiB allocated at peak, %s GiB of torch reservation growth); %d KV cache blocks (%s GiB)
# fit within the requested %s GiB. Torch may reserve up to %s GiB."
MEMORY_AFTER_WARMUP = Wording(
    "Memory after warmup: ", Fig(NUM), " GiB free, ", Fig(NUM), " GiB committed to the KV cache, ", Fig(NUM),
    " GiB kept for transient activations (", Fig(NUM), " GiB allocated at peak, ", Fig(NUM),
    " GiB of torch reservation growth); ", Fig(r"\d+"), " KV cache blocks (", Fig(NUM), " GiB) fit within the requested ",
    Fig(NUM), " GiB.",
)
REMAPPED = Wording("Remapping the KV cache from ", Fig(r"\d+"), " to ", Fig(r"\d+"), " blocks")
EXTENDED = Wording("Extended KV cache to ", Fig(r"\d+"), " blocks (", Fig(NUM), " GiB).")
# "Disabling the extensible KV cache: %s. The KV cache will be sized from profiling estimates instead of
# measured memory." (WARNING); its reason may hold periods ("the HIP runtime (7.0) rejects ...").
EXTENSIBLE_OFF_RE = _re(r"Disabling the extensible KV cache: (.{1,600}?)\. The KV cache will be sized from")
# "Extensible KV cache off: without an IMEX channel, KV transfers within a host ... --enable-extensible-kv-cache."
EXTENSIBLE_OFF_IMEX_RE = _re(r"Extensible KV cache off: (without an IMEX channel)")
# "gpu_memory_utilization=%s caps this instance at %s GiB, keeping %s GiB of free device memory out of
# the KV cache. ..." (WARNING, an explicit 0.7 < gmu < 1.0 withholding >= 1 GiB).
GMU_CAPS = Wording("gpu_memory_utilization=", Fig(NUM), " caps this instance at ", Fig(NUM), " GiB, keeping ",
                   Fig(NUM), " GiB of free device memory out of the KV cache")
# The refusal's advice (0.34, _more_kv_cache_memory_hint): which check refused, and whether the extensible
# KV cache was on. After warmup: "... after the model, its activations, CUDA graphs and warmup ...".
REFUSAL_AFTER_WARMUP_RE = _re(r"the model, its activations, CUDA graphs and warmup")
REFUSAL_EXTENSIBLE_RE = _re(r"The extensible KV cache already takes all device memory left after|"
                            r"The KV cache gets what is left after the model")
REFUSAL_NOT_EXTENSIBLE_RE = _re(r"despite its name\)\. Decreasing `max_model_len` also reduces what is needed")

# Refusals. V1 0.7-0.8.2 "GB" and "models's"; 0.8.3+ GiB; 0.14+ format_gib ("16.0");
# after 0.21 "model's". vLLM prints a stray "(" before the needed figure ("(196608), (23.25 GiB KV
# cache is needed"); pastes in 2026 threads show the sentence without it ("(1048576), 22.5 GiB KV
# cache is needed", kaito-project/kaito#2132): both are the refusal.
REFUSAL_V1 = Wording(
    "To serve at least one request with the ", Either(("model's", "models's")), " max seq len (", Fig(r"\d+"), "), ",
    Maybe(("(",)), Fig(NUM), " ", Either(("GiB", "GB"), capture=True),
    " KV cache is needed, which is larger than the available KV cache memory (", Fig(NUM), " ", Either(("GiB", "GB")),
    ")",
)
# 0.9.1+ (0.8.4-0.9.0.1 print "Based on the available memory,  Try ..." with no number): see
# ESTIMATE_AFTER_RE below, read only right after the refusal's figures.
# V0 (<=0.10 fallback path); the second number is the KV capacity in tokens.
REFUSAL_V0 = Wording(
    "The model's max seq len (", Fig(r"\d+"),
    ") is larger than the maximum number of tokens that can be stored in KV cache (", Fig(r"\d+"), ")",
)
# Config-time refusal (all versions); the derived length may print as a float after rope scaling.
# The requested length is the first number; the key that set the maximum names the config field.
ABOVE_DERIVED = Wording(
    "User-specified max_model_len (", Fig(r"\d+"), ") is greater than the derived max_model_len (", Fig(r"\w+"), "=",
    Fig(r"\d+"), Re(r"(?:\.0+)?"), " or",
)
MAMBA = Wording("max_num_seqs (", Fig(r"\d+"), ") exceeds available Mamba cache blocks (", Fig(r"\d+"), ")")
# Ceilings that are not memory (vllm/config/scheduler.py and vllm/config/vllm.py in the 0.33.0 wheel):
# with chunked prefill off a prompt must fit one batch (a config-time refusal, all V1 versions); 0.33
# lowers max_model_len to a speculative-decoding draft model's (a warning: the boot goes on, shorter).
BATCHED_BELOW_LEN = Wording("max_num_batched_tokens (", Fig(r"\d+"), ") is smaller than max_model_len (", Fig(r"\d+"), ")")
# 0.33's reason between the two lengths is read as text, so that a line broken inside it is a cut of it.
DRAFT_LIMIT = Wording("The draft model's max_model_len (", Fig(r"\d+"), ") is smaller than the target model's (",
                      Fig(r"\d+"), ")", Maybe((" and the V2 model runner can't skip speculation for longer sequences;",)),
                      " reducing max_model_len to ", Fig(r"\d+"), ".")  # (the period: a figure a cut left whole)
# V1 0.9.1+: "Free memory on device [cuda:0 ](X/Y GiB) on startup is less than desired ...".
FREE_MEMORY = Wording(
    "Free memory on device ", Maybe((Re(r"[^\s(]\S{0,31}"), " ")), "(", Fig(NUM), "/", Fig(NUM), " GiB) on startup is less than",
    Maybe((" desired GPU memory utilization (", Fig(NUM), ", ", Fig(NUM), " GiB)")),
)

# CUDA graphs: "Graph capturing finished in 12 secs, took 0.52 GiB" (0.6.4+);
# 0.18+ "Estimated CUDA graph memory: 0.61 GiB total".
GRAPH = Wording("Graph capturing finished in ", Re(r"\d+"), " secs, took ", Fig(NUM), " GiB")
GRAPH_ESTIMATE = Wording("Estimated CUDA graph memory: ", Fig(NUM), " GiB")

# torch.compile cache (compilation/backends.py, decorators.py): warm "Directly load the compiled
# graph(s) for compile range ... from the cache" / "Directly load AOT compilation from path";
# cold "Compiling a graph for compile range|dynamic shape ... takes", "Cache the graph of compile
# range ... for later use", "saved AOT compiled function". A cold cache costs KV tokens (issue 14).
COMPILE_WARM_RE = _re(r"Directly load (?:the compiled graph|AOT compilation)")
COMPILE_COLD_RE = _re(r"Compiling a graph for |Cache the graph (?:of compile range|for dynamic shape)|saved AOT compiled function")

# Server listening: 0.7.3-0.17 "Starting vLLM API server [0 ]on URL", 0.18+ "Starting vLLM server on
# URL"; <=0.7.2 only uvicorn's "Uvicorn running on URL"; uvicorn "Application startup complete."
LISTEN_RE = _re(r"Starting vLLM (?:API )?server(?: \d+)? on (\S{1,300})|Uvicorn running on (\S{1,300})")
STARTUP_COMPLETE = "Application startup complete"
STARTUP_COMPLETE_RE = _re(r"Application startup complete")
# The estimate is the refusal's next sentence (0.9.1+): "... memory (5.23 GiB). Based on the
# available memory, the estimated maximum model length is 42832."
# vLLM ends the sentence with a period: a number that ends the line may have lost digits to a cut.
ESTIMATE_AFTER = Wording(".", Re(r"\s{0,3}"), "Based on the available memory,", Re(r"\s{0,3}"),
                         "the estimated maximum model length is ", Fig(r"\d+"), ".")
# Auto-fit's KV figure: "(5.23 GiB available for KV cache)" (0.14-0.21), "memory (5.1 GiB GPU)" (after 0.21).
# 0.34: "(5.1 GiB GPU available for the KV cache)", "(5.1 GiB GPU left for the KV cache after CUDA graph
# capture and warmup)".
AUTOFIT_AVAILABLE_RE = _re(r"\((" + NUM + r") GiB(?: available for KV cache| GPU(?: available for the KV cache|"
                           r" left for the KV cache after CUDA graph capture and warmup)?)?\)")
# argparse, before vLLM starts (exit 2): "api_server.py: error: unrecognized arguments: --max-modle-len",
# "error: argument --kv-cache-dtype: invalid choice: 'fp9' (choose from 'auto', ...)" (the value is a repr),
# "error: ambiguous option: --max could match --max-model-len, --max-num-seqs".
UNRECOGNIZED_RE = _re(r"error: unrecognized arguments: (\S.{0,300})")
INVALID_CHOICE_RE = _re(r"error: argument ([^\s:]{1,200}): invalid choice: '([^']{0,200})'")
AMBIGUOUS_RE = _re(r"error: ambiguous option: ([^\s=]{1,200}) could match")
# Names to mask in later lines: the engine config's model='...' / tokenizer='...', and the
# banner's "vLLM server version X, serving model M" (0.15+ without the logo).
CONFIG_MODEL_RE = _re(r"\b(?:model|tokenizer|served_model_name)='([^']{4,500})'")
SERVING_MODEL_RE = _re(r"serving model (\S{4,500})")
# The engine's config line: the model it loads (vLLM's default when the command names none).
ENGINE_MODEL_RE = _re(r"with config: model='([^']{1,500})'")
# 0.9+ V1 frontend, after the KV cache is allocated: "Engine 000: vllm cache_config_info with
# initialization after num_gpu_blocks is: 15745".
ENGINE_GPU_BLOCKS_RE = _re(r"(?:Engine \d+: )?vllm cache_config_info with initialization after num_gpu_blocks is: (\d+)")


# --- one cheap search before the many ---------------------------------------------------------
# Most lines carry no needle, no request or echo marker and no failure signature; one search for
# a short window of each of those literals tells them apart. A window is chosen outside the text
# that most lines of a boot log carry (prefixes, traceback frames, the most frequent words), and
# starting at the literal's rarest character, so that the search skips most positions at once.
_COMMON_CHARS = " eirnotaslp1c_d0:um.^/g2hy,v=9-3\n54k'7fb(IF)N][68ORPEwAC\"TSxMLzGWDqUB`"
_TYPICAL_TEXT = (
    "(EngineCore_DP0 pid=1) (EngineCore pid=1) (VllmWorker rank=0 pid=1) (Worker pid=1) (Worker_TP0 pid=1) "
    "(RayWorkerWrapper pid=1, ip=10.0.0.1) (APIServer pid=1) INFO WARNING ERROR DEBUG 09-15 10:05:40 [core.py:12] "
    'Traceback (most recent call last): File "/usr/lib/python3.12/site-packages/vllm/v1/engine/core.py", line 12, '
    "in run_engine_core Error: initialization quantization utilization kv_cache_dtype kv_cache_utils backend "
    "default request version Using with "
)
PREFILTER_WINDOW = 5

# Python's regex parser (re._parser from 3.11, sre_parse before): private, its stubs do not cover what is read here.
_sre_parse: Any = importlib.import_module("re._parser" if sys.version_info >= (3, 11) else "sre_parse")


@functools.cache  # the catalog's patterns are read twice at import
def leading_literal(pattern: str) -> str:
    """The text every match of ``pattern`` (compiled without flags) starts with: its leading
    characters that are neither optional nor repeated ('' when it starts with anything else)."""
    try:
        parsed = _sre_parse.parse(pattern)
    except Exception:
        return ""
    if parsed.state.flags & (re.IGNORECASE | re.VERBOSE):
        return ""
    chars = []
    for op, value in parsed:
        if op is not _sre_parse.LITERAL:
            break
        chars.append(chr(value))
    return "".join(chars)


def _window(literal: str) -> str:
    width = min(len(literal), PREFILTER_WINDOW)

    def commonness(at: int) -> tuple[bool, int, int]:
        rank = _COMMON_CHARS.find(literal[at])
        return literal[at : at + width] in _TYPICAL_TEXT, -len(_COMMON_CHARS) if rank < 0 else -rank, at

    start = min(range(len(literal) - width + 1), key=commonness)
    return literal[start : start + width]


def prefilter(literals: Iterable[str]) -> re.Pattern[str]:
    """A regex found in every line that holds any of ``literals`` (and in some others): its search
    returning None proves that none of them is in the line. An empty literal makes it match all."""
    literals = list(literals)
    windows = sorted({_window(literal) for literal in literals}) if all(literals) else [""]
    # A window that holds another is redundant (the shorter one is found wherever it is); so none
    # left is the start of another, and each one ends a path of the tree below.
    kept = [w for w in windows if not any(o != w and o in w for o in windows)]
    tree: dict = {}
    for window in kept:
        node = tree
        for ch in window:
            node = node.setdefault(ch, {})
    return re.compile(_alternatives(tree))


def _alternatives(tree: dict) -> str:
    """A tree of characters as one regex that tries each first character once (faster than a flat
    alternation of the words)."""
    branches = [re.escape(ch) + _alternatives(rest) for ch, rest in sorted(tree.items())]
    return branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")" if branches else ""
