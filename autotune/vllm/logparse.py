"""Streaming parser for vLLM boot logs: lines in, facts out.

Feed the merged stdout+stderr of ``vllm serve`` line by line to a
``BootLogParser``. Each recognised value becomes a ``Fact`` (key, value, line
number, the cleaned line) and the parser keeps a running verdict:

* ``refused``: vLLM refused the requested ``--max-model-len`` because the KV
  cache is too small (V1 ``To serve at least one request ...`` or V0
  ``The model's max seq len (N) is larger than ...``);
* ``error``: another fatal failure from ``autotune.vllm.catalog`` was seen;
* ``ready``: the KV cache was sized or the server said it is listening;
* ``incomplete``: none of these yet.

Formats are documented in ``log-formats.md`` (vLLM 0.6 -> 0.33); the comments
next to each regex say which versions print what. Every regex is used with
``re.search`` on a cleaned line and is never anchored with ``^``: lines carry
prefixes such as ``(EngineCore_DP0 pid=1) ``, ``[rank0]: ``, docker compose
``svc-1   | ``, journald ``авг 18 14:15:02 host python3[1]: ``, ``> `` quotes.

Rules the fixtures pin down:

* the first value seen for a key wins, except that the strong attention
  backend line beats the generic one, and a real ``Available KV cache memory``
  line beats the value taken from the CPU backend's ``Auto/Explicitly set``;
* ``max_model_len_requested`` comes only from refusal lines, never from args;
* numbers are kept as printed: thousands separators dropped, ``4.00`` -> 4.0,
  ``131072`` -> 131072;
* ``error_kind`` is the first specific fatal cause; the generic engine-death
  lines give ``engine_died`` only while no specific cause has been seen;
* fatal signatures that appear after the server reported it is listening are
  request-time failures, not boot failures: they are recorded as
  ``post_ready_error_kind`` and do not change the outcome.

Stdlib only; no I/O except ``parse_file``.
"""

from __future__ import annotations

import ast
import math
import re
from copy import deepcopy
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable, Iterable

from autotune.vllm import catalog

__all__ = [
    "SCHEMA_KEYS",
    "Fact",
    "BootLogParser",
    "parse_lines",
    "parse_file",
    "ceiling_from",
    "clean_line",
    "MAX_LINE_BYTES",
    "TEXT_MAX",
]

# The `autotune parse --json` contract, in this order.
SCHEMA_KEYS: tuple[str, ...] = (
    "vllm_version",
    "non_default_args",
    "attention_backend",
    "weights_gib",
    "available_kv_gib",
    "kv_cache_tokens",
    "max_concurrency",
    "max_concurrency_tokens",
    "gpu_blocks",
    "cpu_blocks",
    "max_model_len_requested",
    "kv_needed_gib",
    "refusal_available_kv_gib",
    "estimated_max_model_len",
    "kv_cache_max_tokens",
    "outcome",
    "error_kind",
)

MAX_LINE_BYTES = 1 << 20  # longer lines are cut (parse_file and feed)
TEXT_MAX = 400  # Fact.text length
# Block size of the CUDA KV cache; used only for the 0.7-0.9.0.1 computed ceiling.
CUDA_BLOCK_SIZE = 16

_REFUSAL_KINDS = ("kv_cache_insufficient", "kv_cache_insufficient_legacy")


@dataclass(frozen=True)
class Fact:
    key: str
    value: object  # int/float/str/dict/list/bool, JSON-serialisable
    line_no: int  # 1-based line number in the stream
    text: str  # the cleaned line (at most TEXT_MAX chars, a window around the value)


# ---------------------------------------------------------------------------
# Line cleaning
# ---------------------------------------------------------------------------

# Real ANSI CSI sequences (colour since 0.12 on a TTY, tqdm's erase-line) and the
# caret notation users paste from terminals ("^[[0;36m(EngineCore_DP0 pid=1)^[[0;0m").
_ANSI_RE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\^\[\[[0-9;]*[A-Za-z]")


def clean_line(line: str) -> str:
    """Drop NULs, carriage returns (vLLM's multi-line messages end in ``\\r``) and
    ANSI colour codes; make the text encodable as UTF-8. Nothing else is touched."""
    if "\x00" in line:
        line = line.replace("\x00", "")
    if "\r" in line:
        line = line.replace("\r", "")
    if "\x1b" in line or "^[" in line:
        line = _ANSI_RE.sub("", line)
    if not line.isascii():
        try:
            line.encode("utf-8")
        except UnicodeEncodeError:  # lone surrogates from a str caller
            line = line.encode("utf-8", "replace").decode("utf-8")
    return line


# ---------------------------------------------------------------------------
# Regexes (compiled once). NUM is a number as printed, INT an integer that may
# carry thousands separators.
# ---------------------------------------------------------------------------
_NUM = r"-?\d+(?:\.\d+)?"
_INT = r"\d[\d,]*"

# Version. 0.6-0.14: "vLLM API server version X"; 0.15+ with VLLM_DISABLE_LOG_LOGO=1:
# "vLLM server version X, serving model M".
_SERVER_VERSION_RE = re.compile(r"vLLM (?:API )?server version ([\w.+\-]{1,64})")
# 0.15+ logo banner: " ▄▄ ▄█ █     █     █ ▀▄▀ █  version 0.18.0". Only taken when the
# text before "version" holds the logo's block characters.
_LOGO_VERSION_RE = re.compile(r"\bversion\s+([\w.+\-]{1,64})[\s`]*$")
_LOGO_CHARS = ("█", "▄", "▀")
# V0 "Initializing an LLM engine (v0.6.1) with config", V1 "Initializing a V1 LLM engine (v0.8.1)".
_ENGINE_VERSION_RE = re.compile(r"Initializing an? (?:V[01] )?LLM engine \(v([^)\s]{1,64})\)")
_MAX_SEQ_LEN_RE = re.compile(r"\bmax_seq_len=(\d+)")

# Arguments. 0.9+: "non-default args: {...}" (a dict repr); <=0.8.5: "args: Namespace(...)".
_NON_DEFAULT_ARGS = "non-default args: "
_NAMESPACE_ARGS = "args: Namespace("
_DICT_KEY_RE = re.compile(r"\s*(?:'((?:[^'\\]|\\.)*)'|\"((?:[^\"\\]|\\.)*)\")\s*:(.*)", re.S)
_NS_KEY_RE = re.compile(r"\s*([A-Za-z_]\w*)=(.*)", re.S)
# 0.9.2+ (verified 0.10.2+): the resolved length ("auto" -> the derived maximum).
_MAX_MODEL_LEN_RESOLVED_RE = re.compile(r"Using max model len (\d+)")

# Attention backend. 0.12+: "Using FLASH_ATTN attention backend out of potential backends: ...".
_BACKEND_STRONG_RE = re.compile(r"Using (\w+) attention backend out of potential backends")
# V0 "Using XFormers backend.", V1 0.7-0.10 "Using Flash Attention backend on V1 engine.",
# 0.11+ "Using FLASH_ATTN backend." or a forced enum "Using AttentionBackendEnum.FLASH_ATTN backend.".
# The trailing period is required: "[mxfp4.py:165] Using Triton backend" is a MoE kernel line.
_BACKEND_GENERIC_RE = re.compile(
    r"\bUsing ([A-Za-z_][\w .\-]{0,60}?) backend(?: on V1 engine)?(?:\.|\s+by default\b)"
)
# Words that mark a kernel/other-component backend, not the attention backend.
_NOT_ATTENTION_RE = re.compile(r"(?i)moe|gemm|kernel|sampl|quant|fp8|fp4|linear|reduce|lora|vit\b")
_FALLBACK_FA2_RE = re.compile(r"Cannot use FlashAttention-2 backend for [^.\n]{1,200}\.")
_FALLBACK_FA_VERSION_RE = re.compile(r"Cannot use FA version \d+ is not supported due to [^\n]{1,300}")

# Weights. V0/V1 <=0.7.3 "Loading model weights took 14.9888 GB"; 0.8.0-0.8.2
# "Model loading took X GB and Ys"; 0.8.3+ GiB; 0.11.1+ "GiB memory and".
_WEIGHTS_RE = re.compile(r"(?:Loading model weights|Model loading) took (" + _NUM + r") (GiB|GB)\b")

# KV sizing. V1 0.8.0+ "GPU KV cache size: 42,832 tokens" (CPU backend prints "GPU" too up to
# 0.21); after 0.21 one line "CPU KV cache size: N tokens, Maximum concurrency for ...".
_KV_TOKENS_RE = re.compile(r"(?:\b(GPU \+ host|[A-Z]{2,6}) )?KV cache size: (" + _INT + r") tokens")
# V0 0.6.3+ and V1 0.7.1+ (V1 with commas from 0.8.0).
_CONCURRENCY_RE = re.compile(
    r"Maximum concurrency for (" + _INT + r") tokens per request: (" + _NUM + r")x"
)
# V0 "# GPU blocks: N, # CPU blocks: M" (<=0.6), "# CUDA blocks: ..." (0.7+, dispatch key;
# some builds print it lowercase), V1 0.7 "# GPU blocks: N", V0 CPU "# CPU blocks: N"
# (<=0.6, the KV pool) and "# CPU blocks: N, # CPU blocks: 0" (0.7-0.9 CPU).
_BLOCKS_RE = re.compile(r"# (\w{1,16}) blocks: (\d+)(?:, # CPU blocks: (\d+))?")
# V1 0.9.1+ (before a refusal too).
_AVAILABLE_KV_RE = re.compile(r"Available KV cache memory: (" + _NUM + r") GiB")
# V0 0.6.4 only: "Memory profiling results: ... kv_cache_size=2.89GiB ...".
_V0_KV_CACHE_SIZE_RE = re.compile(r"\bkv_cache_size=(" + _NUM + r") ?GiB")
# V0 0.6.5-0.10 multi-line profile: "... the rest of the memory reserved for KV Cache is 5.23GiB."
_V0_KV_RESERVED_RE = re.compile(r"the rest of the memory reserved for KV Cache is (" + _NUM + r") ?GiB")
# CPU backend 0.20+: "Auto set (X/Y) GiB for KV cache on node 0, with R GiB requested memory
# for the worker. N GiB memory was consumed by non-kv usages." / "Explicitly set (X/Y) GiB ...".
_CPU_KV_SET_RE = re.compile(
    r"(?:Auto|Explicitly) set \((" + _NUM + r")/(" + _NUM + r")\) GiB for KV cache on node \d+"
    r"(?:, with (" + _NUM + r") GiB requested memory for the worker\. (" + _NUM + r") GiB memory"
    r" was consumed by non-kv usages)?"
)
# CPU backend 0.13-0.19 "VLLM_CPU_KVCACHE_SPACE not set. Using 31.5 GiB for KV cache." and
# <=0.12 "... VLLM_CPU_KVCACHE_SPACE (GiB) for CPU backend is not set, using 4 by default."
_CPU_KVCACHE_SPACE_RE = re.compile(
    r"VLLM_CPU_KVCACHE_SPACE not set\. Using (" + _NUM + r") GiB for KV cache"
    r"|VLLM_CPU_KVCACHE_SPACE \(GiB?\) for CPU backend is not set, using (" + _NUM + r") by default"
)

# Auto-fit, 0.14+ ("... (5.23 GiB available for KV cache)"; after 0.21 "... memory (5.1 GiB GPU)").
_AUTOFIT_REDUCED_RE = re.compile(r"Auto-fit max_model_len: reduced from (\d+) to (\d+)")
_AUTOFIT_FULL_RE = re.compile(r"Auto-fit max_model_len: full model context length (\d+) fits")
_AUTOFIT_ATTN_FREE_RE = re.compile(r"Auto-fit max_model_len: attention-free model, using derived max_model_len=(\d+)")

# Refusals. V1 0.7-0.8.2 "GB" and "models's"; 0.8.3+ GiB; 0.14+ format_gib ("16.0");
# after 0.21 "model's".
_REFUSAL_V1_RE = re.compile(
    r"To serve at least one request with the models?'s max seq len \((\d+)\), \((" + _NUM + r") (GiB|GB) KV"
    r" cache is needed, which is larger than the available KV cache memory \((" + _NUM + r") (?:GiB|GB)\)"
)
# 0.9.1+ (0.8.4-0.9.0.1 print "Based on the available memory,  Try ..." with no number).
_ESTIMATE_RE = re.compile(r"estimated maximum model length is (\d+)")
# V0 (<=0.10 fallback path); the second number is the KV capacity in tokens.
_REFUSAL_V0_RE = re.compile(
    r"The model's max seq len \((\d+)\) is larger than the maximum number of tokens that can be"
    r" stored in KV cache \((\d+)\)"
)
# Config-time refusal (all versions); the derived length may print as a float after rope scaling.
_ABOVE_DERIVED_RE = re.compile(
    r"User-specified max_model_len \(\d+\) is greater than the derived max_model_len \(\w+=(\d+)(?:\.0+)?\b"
)
_MAMBA_RE = re.compile(r"max_num_seqs \((\d+)\) exceeds available Mamba cache blocks \((\d+)\)")
# V1 0.9.1+: "Free memory on device [cuda:0 ](X/Y GiB) on startup is less than desired ...".
_FREE_MEMORY_RE = re.compile(
    r"Free memory on device (?:\S{1,32} )?\((" + _NUM + r")/(" + _NUM + r") GiB\) on startup is less than"
)

# CUDA graphs: "Graph capturing finished in 12 secs, took 0.52 GiB" (0.6.4+);
# 0.18+ "Estimated CUDA graph memory: 0.61 GiB total".
_GRAPH_RE = re.compile(r"Graph capturing finished in \d+ secs, took (" + _NUM + r") GiB")
_GRAPH_ESTIMATE_RE = re.compile(r"Estimated CUDA graph memory: (" + _NUM + r") GiB")

# Server listening: 0.7.3-0.17 "Starting vLLM API server [0 ]on URL", 0.18+ "Starting vLLM server on
# URL"; <=0.7.2 only uvicorn's "Uvicorn running on URL"; uvicorn "Application startup complete."
_LISTEN_RE = re.compile(r"Starting vLLM (?:API )?server(?: \d+)? on (\S{1,300})|Uvicorn running on (\S{1,300})")
_STARTUP_COMPLETE = "Application startup complete"
# A uvicorn access line means the server answered a request:
# 'INFO:     127.0.0.1:41950 - "POST /v1/completions HTTP/1.1" 500 Internal Server Error'
_ACCESS_RE = re.compile(r"\S:\d{1,5} - \"[A-Z]{3,7} \S{1,2000} HTTP/\d(?:\.\d)?\" \d{3}\b")


# ---------------------------------------------------------------------------
# Small helpers
# ---------------------------------------------------------------------------


def _num(text: str) -> int | float | None:
    """A number as printed: thousands separators dropped; int if no decimal point."""
    try:
        text = text.replace(",", "")
        if "." in text:
            value = float(text)
            return value if math.isfinite(value) else None
        return int(text)
    except (ValueError, OverflowError):
        return None


def _jsonable(value: object) -> object:
    """Make a literal_eval result JSON-serialisable (tuples, sets, bytes, inf, odd keys)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, dict):
        return {(k if isinstance(k, str) else repr(k)): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((_jsonable(v) for v in value), key=repr)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return repr(value)


def _literal(text: str) -> tuple[bool, object]:
    try:
        return True, _jsonable(ast.literal_eval(text.strip()))
    except Exception:  # SyntaxError, ValueError, RecursionError, MemoryError, ...
        return False, None


def _top_level_items(body: str) -> tuple[list[str], bool]:
    """Split the inside of a ``{...}`` / ``Namespace(...)`` repr at top-level commas.

    ``body`` starts right after the opening bracket. Returns the items and whether
    the matching closing bracket was found; when it was not (a cut line) the last,
    partial item is dropped."""
    items: list[str] = []
    depth = 0
    quote = ""
    escaped = False
    start = 0
    for i, ch in enumerate(body):
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = ""
            continue
        if ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            if depth == 0:
                items.append(body[start:i])
                return [it for it in items if it.strip()], True
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(body[start:i])
            start = i + 1
    return [it for it in items if it.strip()], False


def _parse_dict_repr(text: str) -> dict | None:
    """``{'k': v, ...}`` as printed by ``non-default args``: literal_eval, else the
    simple top-level ``'key': value`` pairs (a value that is not a literal, such as
    an enum repr, is kept as its text)."""
    text = text.rstrip().rstrip("`").rstrip()
    if not text.startswith("{"):
        return None
    ok, value = _literal(text)
    if ok and isinstance(value, dict):
        return value
    items, _closed = _top_level_items(text[1:])
    out: dict = {}
    for item in items:
        found = _DICT_KEY_RE.match(item)
        if found is None:
            continue
        key = found.group(1) if found.group(1) is not None else found.group(2)
        raw = found.group(3).strip()
        ok, value = _literal(raw)
        out[key] = value if ok else raw
    return out or None


def _parse_namespace_repr(text: str) -> dict | None:
    """``Namespace(k=v, ...)`` (``args:`` line, vLLM <= 0.8.5): the literal pairs only."""
    items, _closed = _top_level_items(text)
    out: dict = {}
    for item in items:
        found = _NS_KEY_RE.match(item)
        if found is None:
            continue
        ok, value = _literal(found.group(2))
        if ok:
            out[found.group(1)] = value
    return out or None


def _window(line: str, start: int, end: int) -> str:
    """At most TEXT_MAX chars of ``line``, showing the span [start, end)."""
    if len(line) <= TEXT_MAX or end <= TEXT_MAX:
        return line[:TEXT_MAX]
    lo = max(0, min(start - 100, len(line) - TEXT_MAX))
    return line[lo : lo + TEXT_MAX]


# ---------------------------------------------------------------------------
# The parser
# ---------------------------------------------------------------------------


class BootLogParser:
    """Streaming: feed lines one by one; keeps state; never raises."""

    def __init__(self) -> None:
        self._facts: dict[str, Fact] = {}
        self._line_no = 0
        self._line = ""  # the cleaned line being processed
        self._new: list[Fact] = []
        self._backend_strong = False
        self._available_from_cpu = False
        self._kv_sized = False
        self._server_ready = False
        self._refusal: Fact | None = None  # error_kind fact of the first refusal
        self._cause: Fact | None = None  # first specific fatal cause
        self._death: Fact | None = None  # first generic engine-death line
        self._internal_errors = 0

    # -- public API ---------------------------------------------------------
    def feed(self, line: str | bytes) -> list[Fact]:
        """Process one line (a trailing newline is ignored; embedded newlines
        split it into several lines). Returns the facts newly set by it."""
        self._new = []
        try:
            for segment in self._segments(line):
                self._line_no += 1
                try:
                    self._process(clean_line(segment[:MAX_LINE_BYTES]))
                except Exception:  # never raise: count it, keep going
                    self._internal_errors += 1
        except Exception:
            self._internal_errors += 1
        return self._new

    @property
    def facts(self) -> dict[str, Fact]:
        return dict(self._facts)

    @property
    def outcome(self) -> str:
        if self._refusal is not None:
            return "refused"
        if self._cause is not None or self._death is not None:
            return "error"
        if self._kv_sized or self._server_ready:
            return "ready"
        return "incomplete"

    @property
    def refused(self) -> bool:
        return self._refusal is not None

    @property
    def fatal(self) -> bool:
        return self.outcome in ("refused", "error")

    @property
    def line_count(self) -> int:
        return self._line_no

    @property
    def internal_errors(self) -> int:
        """How many lines raised inside the parser (caught). 0 unless there is a bug."""
        return self._internal_errors

    def result(self) -> dict:
        outcome = self.outcome
        out: dict = {}
        for key in SCHEMA_KEYS:
            if key == "outcome":
                out[key] = outcome
            elif key in self._facts:
                out[key] = deepcopy(self._facts[key].value)
        for key, fact in self._facts.items():
            if key not in out:
                out[key] = deepcopy(fact.value)
        return out

    def provenance(self) -> dict:
        return {
            key: {"line": fact.line_no, "text": fact.text}
            for key, fact in self._facts.items()
        }

    # -- internals ----------------------------------------------------------
    @staticmethod
    def _segments(line: str | bytes) -> list[str]:
        if isinstance(line, (bytes, bytearray, memoryview)):
            text = bytes(line).decode("utf-8", "replace")
        elif isinstance(line, str):
            text = line
        else:
            text = "" if line is None else str(line)
        if text.endswith("\n"):
            text = text[:-1]
        return text.split("\n")

    def _set(self, key: str, value: object, span: tuple[int, int] = (0, 0), *, replace: bool = False) -> None:
        if value is None or (key in self._facts and not replace):
            return
        fact = Fact(key, value, self._line_no, _window(self._line, span[0], span[1]))
        self._facts[key] = fact
        self._new.append(fact)

    def _set_num(self, key: str, found: re.Match[str], group: int) -> None:
        self._set(key, _num(found.group(group)), found.span(group))

    def _process(self, line: str) -> None:
        self._line = line
        for needles, handler in _RULES:
            for needle in needles:
                if needle in line:
                    handler(self, line)
                    break
        hit = catalog.search(line)
        if hit is not None:
            self._signature(hit[0], hit[1])

    # error_kind bookkeeping -------------------------------------------------
    def _signature(self, kind: catalog.FailureKind, found: re.Match[str]) -> None:
        span = found.span()
        if not kind.fatal:
            fact = self._facts.get("warning_kinds")
            if fact is None:
                self._set("warning_kinds", [kind.kind], span)
            elif kind.kind not in fact.value:  # type: ignore[operator]
                updated = Fact("warning_kinds", [*fact.value, kind.kind], fact.line_no, fact.text)  # type: ignore[misc]
                self._facts["warning_kinds"] = updated
                self._new.append(updated)
            return
        if self._server_ready:
            # The server was already listening: a request-time failure, not a boot failure.
            self._set("post_ready_error_kind", kind.kind, span)
            return
        fact = Fact("error_kind", kind.kind, self._line_no, _window(self._line, *span))
        if kind.kind in _REFUSAL_KINDS:
            if self._refusal is None:
                self._refusal = fact
        elif kind.kind == "engine_died":
            if self._death is None:
                self._death = fact
        elif self._cause is None:
            self._cause = fact
        winner = self._refusal or self._cause or self._death
        if self._facts.get("error_kind") is not winner and winner is not None:
            self._facts["error_kind"] = winner
            self._new.append(winner)

    # handlers ---------------------------------------------------------------
    def _on_version(self, line: str) -> None:
        if "vllm_version" in self._facts:
            return
        found = _SERVER_VERSION_RE.search(line) or _ENGINE_VERSION_RE.search(line)
        if found is None:
            logo = _LOGO_VERSION_RE.search(line)
            if logo is not None and any(c in line[: logo.start()] for c in _LOGO_CHARS):
                found = logo
        if found is not None:
            self._set("vllm_version", found.group(1).rstrip(".,"), found.span(1))

    def _on_engine_config(self, line: str) -> None:
        self._on_version(line)
        if "with config" in line:
            found = _MAX_SEQ_LEN_RE.search(line)
            if found is not None:
                self._set_num("max_seq_len_engine", found, 1)

    def _on_non_default_args(self, line: str) -> None:
        if "non_default_args" in self._facts:
            return
        at = line.find(_NON_DEFAULT_ARGS) + len(_NON_DEFAULT_ARGS)
        value = _parse_dict_repr(line[at:])
        if value is not None:
            self._set("non_default_args", value, (at, len(line)))

    def _on_namespace(self, line: str) -> None:
        if "args_namespace" in self._facts:
            return
        at = line.find(_NAMESPACE_ARGS) + len(_NAMESPACE_ARGS)
        value = _parse_namespace_repr(line[at:])
        if value is not None:
            self._set("args_namespace", value, (at, len(line)))

    def _on_max_model_len_resolved(self, line: str) -> None:
        found = _MAX_MODEL_LEN_RESOLVED_RE.search(line)
        if found is not None:
            self._set_num("max_model_len_resolved", found, 1)

    def _on_backend(self, line: str) -> None:
        strong = _BACKEND_STRONG_RE.search(line)
        if strong is not None:
            if not self._backend_strong:
                self._backend_strong = True
                self._set("attention_backend", strong.group(1), strong.span(1), replace=True)
            return
        if "attention_backend" in self._facts:
            return
        generic = _BACKEND_GENERIC_RE.search(line)
        if generic is None:
            return
        name = generic.group(1).strip()
        if _NOT_ATTENTION_RE.search(name):
            return
        # Forced backend prints the enum repr: "AttentionBackendEnum.FLASH_ATTN" -> FLASH_ATTN.
        if "." in name:
            name = name.rsplit(".", 1)[1]
        if name:
            self._set("attention_backend", name, generic.span(1))

    def _on_fallback(self, line: str) -> None:
        found = _FALLBACK_FA2_RE.search(line) or _FALLBACK_FA_VERSION_RE.search(line)
        if found is not None:
            self._set("attention_fallback_reason", found.group(0).rstrip(), found.span())

    def _on_took(self, line: str) -> None:
        found = _WEIGHTS_RE.search(line)
        if found is not None and "weights_gib" not in self._facts:
            self._set_num("weights_gib", found, 1)
            self._set("weights_unit_in_log", found.group(2), found.span(2))
        found = _GRAPH_RE.search(line)
        if found is not None:
            self._set_num("cuda_graph_gib", found, 1)

    def _on_kv_tokens(self, line: str) -> None:
        found = _KV_TOKENS_RE.search(line)
        if found is None or "kv_cache_tokens" in self._facts:
            return
        self._set_num("kv_cache_tokens", found, 2)
        if found.group(1):
            self._set("kv_cache_device", found.group(1), found.span(1))
        self._kv_sized = True

    def _on_concurrency(self, line: str) -> None:
        found = _CONCURRENCY_RE.search(line)
        if found is not None and "max_concurrency" not in self._facts:
            self._set_num("max_concurrency_tokens", found, 1)
            self._set_num("max_concurrency", found, 2)

    def _on_blocks(self, line: str) -> None:
        found = _BLOCKS_RE.search(line)
        if found is None:
            return
        device = found.group(1)
        if device.upper() == "CPU":
            # CPU backend: the first number is the KV pool ("# CPU blocks: N" alone in <=0.6,
            # "# CPU blocks: N, # CPU blocks: 0" in 0.7-0.9 where the second is swap).
            self._set_num("cpu_blocks", found, 2)
        else:
            self._set_num("gpu_blocks", found, 2)
            if found.group(3) is not None:
                self._set_num("cpu_blocks", found, 3)
        self._kv_sized = True

    def _on_available_kv(self, line: str) -> None:
        found = _AVAILABLE_KV_RE.search(line)
        if found is None:
            return
        if self._available_from_cpu:
            self._available_from_cpu = False
            self._set("available_kv_gib", _num(found.group(1)), found.span(1), replace=True)
        else:
            self._set_num("available_kv_gib", found, 1)

    def _on_v0_profile(self, line: str) -> None:
        found = _V0_KV_CACHE_SIZE_RE.search(line)
        if found is not None:
            self._set_num("kv_cache_size_gib", found, 1)
        found = _V0_KV_RESERVED_RE.search(line)
        if found is not None:
            self._set_num("kv_cache_reserved_gib", found, 1)

    def _on_cpu_kv_set(self, line: str) -> None:
        found = _CPU_KV_SET_RE.search(line)
        if found is None or "cpu_kv_gib" in self._facts:
            return
        self._set_num("cpu_kv_gib", found, 1)
        self._set_num("cpu_node_total_gib", found, 2)
        if found.group(3) is not None:
            self._set_num("cpu_worker_requested_gib", found, 3)
            self._set_num("cpu_non_kv_gib", found, 4)
        # On CPU this is the KV pool; used only until a real "Available KV cache memory" line.
        if "available_kv_gib" not in self._facts:
            value = _num(found.group(1))
            if value is not None:
                self._set("available_kv_gib", value, found.span(1))
                self._available_from_cpu = True

    def _on_cpu_kvcache_space(self, line: str) -> None:
        found = _CPU_KVCACHE_SPACE_RE.search(line)
        if found is not None:
            group = 1 if found.group(1) is not None else 2
            self._set_num("cpu_kvcache_space_gib", found, group)

    def _on_autofit(self, line: str) -> None:
        found = _AUTOFIT_REDUCED_RE.search(line)
        if found is not None:
            self._set_num("autofit_from", found, 1)
            self._set_num("autofit_max_model_len", found, 2)
            return
        found = _AUTOFIT_FULL_RE.search(line) or _AUTOFIT_ATTN_FREE_RE.search(line)
        if found is not None:
            self._set_num("autofit_max_model_len", found, 1)

    def _on_refusal(self, line: str) -> None:
        found = _REFUSAL_V1_RE.search(line)
        if found is not None:
            if "max_model_len_requested" not in self._facts:
                self._set_num("max_model_len_requested", found, 1)
                self._set_num("kv_needed_gib", found, 2)
                self._set("refusal_unit_in_log", found.group(3), found.span(3))
                self._set_num("refusal_available_kv_gib", found, 4)
            return
        found = _REFUSAL_V0_RE.search(line)
        if found is not None and "max_model_len_requested" not in self._facts:
            self._set_num("max_model_len_requested", found, 1)
            self._set_num("kv_cache_max_tokens", found, 2)

    def _on_estimate(self, line: str) -> None:
        found = _ESTIMATE_RE.search(line)
        if found is not None:
            self._set_num("estimated_max_model_len", found, 1)

    def _on_above_derived(self, line: str) -> None:
        found = _ABOVE_DERIVED_RE.search(line)
        if found is not None:
            self._set_num("derived_max_model_len", found, 1)

    def _on_mamba(self, line: str) -> None:
        found = _MAMBA_RE.search(line)
        if found is not None:
            self._set_num("max_num_seqs_refused", found, 1)
            self._set_num("mamba_cache_blocks", found, 2)

    def _on_free_memory(self, line: str) -> None:
        found = _FREE_MEMORY_RE.search(line)
        if found is not None:
            self._set_num("startup_free_gib", found, 1)
            self._set_num("startup_total_gib", found, 2)

    def _on_graph_estimate(self, line: str) -> None:
        found = _GRAPH_ESTIMATE_RE.search(line)
        if found is not None:
            self._set_num("cuda_graph_estimated_gib", found, 1)

    def _on_listen(self, line: str) -> None:
        found = _LISTEN_RE.search(line)
        if found is None:
            return
        group = 1 if found.group(1) is not None else 2
        self._set("listen_url", found.group(group), found.span(group))
        self._ready(found.span())

    def _on_startup_complete(self, line: str) -> None:
        at = line.find(_STARTUP_COMPLETE)
        self._ready((at, at + len(_STARTUP_COMPLETE)))

    def _on_access(self, line: str) -> None:
        found = _ACCESS_RE.search(line)
        if found is not None:
            self._ready(found.span())

    def _ready(self, span: tuple[int, int]) -> None:
        self._server_ready = True
        self._set("server_ready", True, span)


# (needles, handler): the handler runs when any needle is a substring of the line.
# Substring tests are cheap, so most lines never reach a regex.
_RULES: tuple[tuple[tuple[str, ...], Callable[[BootLogParser, str], None]], ...] = (
    (("version",), BootLogParser._on_version),
    (("LLM engine (v",), BootLogParser._on_engine_config),
    ((_NON_DEFAULT_ARGS,), BootLogParser._on_non_default_args),
    ((_NAMESPACE_ARGS,), BootLogParser._on_namespace),
    (("Using max model len ",), BootLogParser._on_max_model_len_resolved),
    ((" backend",), BootLogParser._on_backend),
    (("Cannot use F",), BootLogParser._on_fallback),
    ((" took ",), BootLogParser._on_took),
    (("KV cache size: ",), BootLogParser._on_kv_tokens),
    (("Maximum concurrency for ",), BootLogParser._on_concurrency),
    ((" blocks: ",), BootLogParser._on_blocks),
    (("Available KV cache memory: ",), BootLogParser._on_available_kv),
    (("kv_cache_size=", "reserved for KV Cache is "), BootLogParser._on_v0_profile),
    ((" GiB for KV cache on node ",), BootLogParser._on_cpu_kv_set),
    (("VLLM_CPU_KVCACHE_SPACE",), BootLogParser._on_cpu_kvcache_space),
    (("Auto-fit max_model_len: ",), BootLogParser._on_autofit),
    (("max seq len (",), BootLogParser._on_refusal),
    (("estimated maximum model length is ",), BootLogParser._on_estimate),
    (("User-specified max_model_len (",), BootLogParser._on_above_derived),
    (("Mamba cache blocks (",), BootLogParser._on_mamba),
    (("Free memory on device",), BootLogParser._on_free_memory),
    (("Estimated CUDA graph memory: ",), BootLogParser._on_graph_estimate),
    (("Starting vLLM ", "Uvicorn running on "), BootLogParser._on_listen),
    ((_STARTUP_COMPLETE,), BootLogParser._on_startup_complete),
    ((" HTTP/",), BootLogParser._on_access),
)


# ---------------------------------------------------------------------------
# Entry points
# ---------------------------------------------------------------------------


def parse_lines(lines: Iterable[str | bytes]) -> BootLogParser:
    parser = BootLogParser()
    for line in lines:
        parser.feed(line)
    return parser


def parse_file(path) -> BootLogParser:
    """Parse a log file in bounded memory: read in binary, line by line; a line
    longer than MAX_LINE_BYTES is cut there and the rest of it skipped."""
    parser = BootLogParser()
    with open(path, "rb") as handle:
        while True:
            chunk = handle.readline(MAX_LINE_BYTES)
            if not chunk:
                break
            if not chunk.endswith(b"\n") and len(chunk) >= MAX_LINE_BYTES:
                # Skip the rest of this over-long line.
                while True:
                    rest = handle.readline(MAX_LINE_BYTES)
                    if not rest or rest.endswith(b"\n"):
                        break
            parser.feed(chunk)
    return parser


def ceiling_from(result: dict) -> tuple[int | None, str]:
    """The largest max_model_len the log says fits, and how it was obtained.

    * ``estimate``: V1 refusal, ``estimated maximum model length is N`` (0.9.1+);
    * ``v0_kv_capacity``: V0 refusal, the KV capacity in tokens;
    * ``computed_from_gib``: V1 refusal without an estimate (0.7-0.9.0.1):
      ``floor(available / needed * requested / 16) * 16``, rounded down, exact on
      the printed decimals (log-formats.md section 2.4); may be 0 (nothing fits);
    * ``autofit``: ``Auto-fit max_model_len: reduced from A to N`` (or the full
      length that fits);
    * ``(None, "none")`` otherwise.
    """
    try:
        estimate = result.get("estimated_max_model_len")
        if _is_int(estimate) and estimate > 0:
            return estimate, "estimate"
        capacity = result.get("kv_cache_max_tokens")
        if _is_int(capacity) and capacity >= 0:
            return capacity, "v0_kv_capacity"
        requested = result.get("max_model_len_requested")
        needed = result.get("kv_needed_gib")
        available = result.get("refusal_available_kv_gib")
        if _is_int(requested) and _is_number(needed) and _is_number(available) and needed > 0 and requested > 0:
            ratio = Fraction(repr(available)) / Fraction(repr(needed))
            blocks = math.floor(ratio * requested / CUDA_BLOCK_SIZE)
            return max(0, blocks) * CUDA_BLOCK_SIZE, "computed_from_gib"
        autofit = result.get("autofit_max_model_len")
        if _is_int(autofit) and autofit > 0:
            return autofit, "autofit"
    except Exception:
        pass
    return None, "none"


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
