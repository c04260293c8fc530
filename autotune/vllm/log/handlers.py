"""What the boot-log parser reads from each kind of vLLM message: the line handlers.

``LineHandlers`` is a stage the parser (parser.py) holds: each ``on_*`` method reads one kind of
message (the parser's ``RULES`` say which needles route a line to it) and records figures through
the ``Recorder`` (boot.py), so that a rejoined line can undo them. The refusals and the other error
messages with figures are read by refusals.py's ``RefusalReader``, which a message broken over lines
is handed to; a failure's ``error_kind`` is the recorder's ``signature``.
Stdlib only; no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from autotune.vllm.log import failures
from autotune.vllm.log import messages as P
from autotune.vllm.log.args import model_names, parse_dict_repr, parse_namespace_repr
from autotune.vllm.log.boot import Recorder, read_number
from autotune.vllm.log.refusals import RefusalReader
from autotune.vllm.log.wording import CutMatch, Wording

MASK = "\u2591"  # hides a model name: no regex (ASCII-only) matches it
QUOTED_RE = re.compile(r"'(?:[^'\\]|\\.){0,2000}'|\"(?:[^\"\\]|\\.){0,2000}\"")


EXCEPTION_MAX = 250  # the stated cause: the start of the final exception line (its Fact.text shows it whole)


def version_at(line: str, start: int) -> re.Match[str] | None:
    """The version a banner line shows where vLLM's message starts (a one-line banner, or the logo's line)."""
    msg = line[start:].lstrip(" `")
    at = len(line) - len(msg)
    found = P.SERVER_VERSION_RE.match(line, at)
    if found is None:
        logo = P.LOGO_VERSION_RE.search(line, at)
        if logo is not None and line[at : logo.start()].strip(" " + "".join(P.LOGO_CHARS)) == "" and any(
            c in line[at : logo.start()] for c in P.LOGO_CHARS
        ):
            found = logo
    return found


def at_message(regex: re.Pattern[str] | Wording, line: str, start: int) -> re.Match[str] | CutMatch | None:
    """``regex`` matched where vLLM's message starts (after its indentation); a ``Wording`` also
    reads a line cut inside its message (the figures before the cut)."""
    while start < len(line) and line[start] in " \t":
        start += 1
    found = regex.match(line, start)
    if isinstance(regex, Wording) and (found is None or regex.tail_cut(found)):
        return regex.read(line, start, found)
    return found


class LineHandlers:
    """The per-message readers: each writes through the recorder; a message that may go on over the next
    lines is handed to the refusal reader (``piece``)."""

    def __init__(self, record: Recorder, refusals: RefusalReader) -> None:
        self.record = record
        self.refusals = refusals

    def on_echo(self, line: str, start: int) -> None:
        # The arguments and the engine config: their own facts only, and the model names to mask.
        msg = line[start:].lstrip()
        begins = len(line) - len(msg)  # each echo is read only where vLLM's message starts
        if msg.startswith(P.NON_DEFAULT_ARGS) and "non_default_args" not in self.record.boot.facts:
            at = begins + len(P.NON_DEFAULT_ARGS)
            value = parse_dict_repr(line[at:])
            if value is not None:
                self.record.set("non_default_args", value, (at, len(line)))
                self._add_models(model_names(value))
                self._served_model(line, at, value)
        elif msg.startswith(P.NAMESPACE_ARGS) and "args_namespace" not in self.record.boot.facts:
            at = begins + len(P.NAMESPACE_ARGS)
            value = parse_namespace_repr(line[at:])
            if value is not None:
                self.record.set("args_namespace", value, (at, len(line)))
                self._add_models(model_names(value))
                self._served_model(line, at, value)
        found = P.ENGINE_VERSION_RE.match(line, begins)
        if found is not None and "with config" in line:
            self.record.set("vllm_version", (found.group(1) or "").rstrip(".,"), found.span(1))
            model = P.ENGINE_MODEL_RE.search(line, found.end())  # vLLM's default when the command named none
            if model is not None:
                self.record.set("model", model.group(1), model.span(1))
            # Only the config's own max_seq_len: quoted values (the model's name) may hold anything.
            unquoted = QUOTED_RE.sub(lambda m: MASK * len(m.group(0)), line)
            seq = P.MAX_SEQ_LEN_RE.search(unquoted)
            if seq is not None:
                self.record.set_num("max_seq_len_engine", seq, 1)
            self._engine_settings(unquoted, found.end())
            self._add_models(m.group(1) for m in P.CONFIG_MODEL_RE.finditer(line, 0, 20000))

    def _served_model(self, line: str, at: int, args: dict) -> None:
        """The model an arguments line names (`vllm serve M` puts M in model_tag), where it stands."""
        model = args.get("model_tag") or args.get("model")
        if isinstance(model, str) and model:
            where = line.find(model, at)
            self.record.set("model", model, (where, where + len(model)) if where >= 0 else (at, len(line)))

    def _add_models(self, names: Iterable[str]) -> None:
        new = tuple(n for n in names if len(n) >= 4 and n not in self.record.boot.models)
        if new:
            self.record.touch()
            self.record.boot.models = tuple(sorted((*self.record.boot.models, *new), key=len, reverse=True))

    def on_version(self, line: str, start: int) -> None:
        found = version_at(line, start)
        if found is not None:
            self.record.set("vllm_version", (found.group(1) or "").rstrip(".,"), found.span(1))
        served = P.SERVING_MODEL_RE.search(line, start)
        if served is not None:
            self._add_models([served.group(1)])
            if MASK not in served.group(1):  # a name read before is masked on the lines after it
                self.record.set("model", served.group(1), served.span(1))

    def on_engine_start(self, line: str, start: int) -> None:
        # "Initializing an LLM engine (v0.5.4) with config" with the config on the next lines.
        found = at_message(P.ENGINE_VERSION_RE, line, start)
        if found is not None:
            self.record.set("vllm_version", (found.group(1) or "").rstrip(".,"), found.span(1))

    def _engine_settings(self, line: str, start: int) -> None:
        """What the engine resolved where a flag was left to vLLM (V1 0.8+ config line):
        engine_settings = {enable_prefix_caching, enable_chunked_prefill, load_format}."""
        settings: dict = {m.group(1): m.group(2) == "True" for m in P.ENGINE_CONFIG_FLAG_RE.finditer(line, start)}
        load_format = P.ENGINE_LOAD_FORMAT_RE.search(line, start)
        if load_format is not None:
            settings["load_format"] = load_format.group(1)
        if settings:
            self.record.set("engine_settings", settings, (start, len(line)))

    def on_max_model_len_resolved(self, line: str, start: int) -> None:
        found = at_message(P.MAX_MODEL_LEN_RESOLVED_RE, line, start)
        if found is not None:
            self.record.set_num("max_model_len_resolved", found, 1)

    def on_backend(self, line: str, start: int) -> None:
        strong = at_message(P.BACKEND_STRONG_RE, line, start)
        if strong is not None:
            if not self.record.boot.backend_strong:
                self.record.touch()
                self.record.boot.backend_strong = True
                self.record.set("attention_backend", strong.group(1), strong.span(1), replace=True)
            return
        generic = at_message(P.BACKEND_GENERIC_RE, line, start)
        if generic is None or "attention_backend" in self.record.boot.facts:
            return
        name = (generic.group(1) or "").strip()
        if P.NOT_ATTENTION_RE.search(name):
            return
        # Forced backend prints the enum repr: "AttentionBackendEnum.FLASH_ATTN" -> FLASH_ATTN.
        name = name.rsplit(".", 1)[1] if "." in name else name
        if name:
            self.record.set("attention_backend", name, generic.span(1))

    def on_fallback(self, line: str, start: int) -> None:
        found = at_message(P.FALLBACK_FA2_RE, line, start) or at_message(P.FALLBACK_FA_VERSION_RE, line, start)
        if found is not None:
            self.record.set("attention_fallback_reason", (found.group(0) or "").rstrip(), found.span())

    def on_took(self, line: str, start: int) -> None:
        found = at_message(P.WEIGHTS, line, start)
        if found is not None and "weights_gib" not in self.record.boot.facts:
            self.record.set_num("weights_gib", found, 1)
            self.record.set("weights_unit_in_log", found.group(2), found.span(2))
        found = at_message(P.GRAPH, line, start)
        if found is not None:
            self.record.set_num("cuda_graph_gib", found, 1)

    def _sized(self) -> None:
        if not self.record.boot.kv_line:
            self.record.touch()
            self.record.boot.kv_line = self.record.line_no

    def on_kv_tokens(self, line: str, start: int) -> None:
        found = at_message(P.KV_TOKENS, line, start)
        if found is None or found.group(2) is None or "kv_cache_tokens" in self.record.boot.facts:
            return  # (a line cut before its figure says nothing of the pool)
        self.record.set_num("kv_cache_tokens", found, 2)
        if found.group(1):
            self.record.set("kv_cache_device", found.group(1), found.span(1))
        self._sized()
        if line.startswith(", ", found.end()):  # after 0.21 the concurrency follows on the same line
            self._concurrency(P.CONCURRENCY.read(line, found.end() + 2))

    def on_concurrency(self, line: str, start: int) -> None:
        self._concurrency(at_message(P.CONCURRENCY, line, start))

    def _concurrency(self, found: re.Match[str] | CutMatch | None) -> None:
        if found is not None and "max_concurrency" not in self.record.boot.facts:
            self.record.set_num("max_concurrency_tokens", found, 1)
            self.record.set_num("max_concurrency", found, 2)

    def on_blocks(self, line: str, start: int) -> None:
        found = at_message(P.BLOCKS_RE, line, start)
        if found is None:
            return
        if (found.group(1) or "").upper() == "CPU":
            # CPU backend: the first number is the KV pool ("# CPU blocks: N" alone in <=0.6,
            # "# CPU blocks: N, # CPU blocks: 0" in 0.7-0.9 where the second is swap).
            self.record.set_num("cpu_blocks", found, 2)
        else:
            self.record.set_num("gpu_blocks", found, 2)
            if found.group(3) is not None:
                self.record.set_num("cpu_blocks", found, 3)
            if read_number(found.group(2)) == 0:
                # Not one block left for the KV cache: V0 raises "No available memory for the
                # cache blocks" next, which a cut log (or a wrapper's own traceback) may not show.
                entry = failures.lookup("negative_available_kv")
                if entry is not None:
                    self.record.signature(entry, found.span(2))
        self._sized()

    def on_engine_blocks(self, line: str, start: int) -> None:
        found = at_message(P.ENGINE_GPU_BLOCKS_RE, line, start)
        if found is not None:
            self.record.set_num("engine_num_gpu_blocks", found, 1)
            self._sized()

    def on_available_kv(self, line: str, start: int) -> None:
        found = at_message(P.AVAILABLE_KV, line, start)
        if found is None or found.group(1) is None:
            return
        value = read_number(found.group(1))
        if self.record.boot.available_from_cpu:
            self.record.touch()
            self.record.boot.available_from_cpu = False
            self.record.set("available_kv_gib", value, found.span(1), replace=True)
        else:
            self.record.set_num("available_kv_gib", found, 1)
        if isinstance(value, (int, float)) and value < 0:
            # Weights and activations took more than the budget; the engine's death follows.
            entry = failures.lookup("negative_available_kv")
            if entry is not None:
                self.record.signature(entry, found.span(1))

    def on_v0_profile(self, line: str, start: int) -> None:
        msg = line[start:].lstrip()
        if msg.startswith("Memory profiling"):
            found = P.V0_KV_CACHE_SIZE.find(line, start)
            if found is not None:
                self.record.set_num("kv_cache_size_gib", found, 1)
        if msg.startswith(("model weights take", "the rest of the memory", "Memory profiling")):
            found = P.V0_KV_RESERVED.find(line, start)
            if found is not None:
                self.record.set_num("kv_cache_reserved_gib", found, 1)

    def on_cpu_kv_set(self, line: str, start: int) -> None:
        found = at_message(P.CPU_KV_SET, line, start)
        if found is None or "cpu_kv_gib" in self.record.boot.facts:
            return
        self.record.set_num("cpu_kv_gib", found, 1)
        self.record.set_num("cpu_node_total_gib", found, 2)
        if found.group(3) is not None:
            self.record.set_num("cpu_worker_requested_gib", found, 3)
            self.record.set_num("cpu_non_kv_gib", found, 4)
        # On CPU this is the KV pool; used only until a real "Available KV cache memory" line.
        if "available_kv_gib" not in self.record.boot.facts and read_number(found.group(1)) is not None:
            self.record.set("available_kv_gib", read_number(found.group(1)), found.span(1))
            self.record.touch()
            self.record.boot.available_from_cpu = True

    def on_cpu_kvcache_space(self, line: str, start: int) -> None:
        found = at_message(P.CPU_KVCACHE_SPACE, line, start)
        if found is not None:
            self.record.set_num("cpu_kvcache_space_gib", found, 1)
        else:
            found = at_message(P.CPU_KVCACHE_SPACE_DEFAULT, line, start)
            if found is not None:
                self.record.set_num("cpu_kvcache_space_gib", found, 1)

    def on_limit(self, line: str, start: int) -> None:
        """A ceiling that is not memory: max-num-batched-tokens (chunked prefill off), a draft model's."""
        found = P.BATCHED_BELOW_LEN.find(line, start)
        if found is not None:
            self.record.set_num("batched_tokens_limit", found, 1)
            self.record.set_num("max_model_len_requested", found, 2)
            self.refusals.piece(found)  # (refusals.py: a message broken over lines)
        found = P.DRAFT_LIMIT.find(line, start)
        if found is not None:
            self.record.set_num("draft_max_model_len", found, 3)
            self.record.set_num("max_model_len_requested", found, 2)
            self.refusals.piece(found)

    def on_autofit(self, line: str, start: int) -> None:
        if P.AUTOFIT_TENTATIVE in line:  # 0.34, extensible: fitted to the upper bound; the final length follows
            self._autofit_tentative(line, start)
            return
        reduced = at_message(P.AUTOFIT_FINAL, line, start)
        final = reduced or at_message(P.AUTOFIT_USING, line, start)
        if final is not None:  # 0.34: the length served (after warmup, or the non-extensible fit)
            group = 2 if reduced is not None else 1
            if reduced is not None:
                self.record.set_num("autofit_from", final, 1)
            if final.group(group) is not None:
                self.record.set("autofit_max_model_len", read_number(final.group(group)), final.span(group),
                                replace=True)
            self._autofit_available(line, final.end() - 1, replace=True)
            if P.AUTOFIT_SHORT in line[final.end():]:
                self.record.set("autofit_short", True, final.span())
            return
        found = at_message(P.AUTOFIT_REDUCED, line, start)
        if found is not None:
            self.record.set_num("autofit_from", found, 1)
            self.record.set_num("autofit_max_model_len", found, 2)
        else:
            found = at_message(P.AUTOFIT_FULL, line, start) or at_message(P.AUTOFIT_ATTN_FREE_RE, line, start)
            if found is not None:
                self.record.set_num("autofit_max_model_len", found, 1)
        if found is not None:
            self._autofit_available(line, found.end())

    def _autofit_available(self, line: str, at: int, replace: bool = False) -> None:
        available = P.AUTOFIT_AVAILABLE_RE.search(line, at)
        if available is not None:
            self.record.set("autofit_available_kv_gib", read_number(available.group(1)), available.span(1),
                            replace=replace)

    def _autofit_tentative(self, line: str, start: int) -> None:
        """0.34's first fit under the extensible KV cache: to the upper bound, not the length served."""
        found = at_message(P.AUTOFIT_REDUCED, line, start)
        if found is not None:
            self.record.set_num("autofit_from", found, 1)
            self.record.set_num("autofit_tentative_max_model_len", found, 2)
        else:
            found = at_message(P.AUTOFIT_FULL, line, start)
            if found is not None:
                self.record.set_num("autofit_tentative_max_model_len", found, 1)
        if found is not None:
            self._extensible(True, "", found.span())

    # -- the extensible KV cache (0.34+) -------------------------------------------------------------
    def _extensible(self, on: bool, why: str, span: tuple[int, int]) -> None:
        """The extensible KV cache's state, a setting of the run: the first word the log gives wins."""
        if "extensible_kv_cache" in self.record.boot.facts:
            return
        self.record.set("extensible_kv_cache", "on" if on else "off", span)
        if why:
            self.record.set("extensible_kv_cache_off_reason", why, span)

    def on_extensible(self, line: str, start: int) -> None:
        off = P.EXTENSIBLE_OFF_RE.search(line, start) or P.EXTENSIBLE_OFF_IMEX_RE.search(line, start)
        if off is not None:
            self._extensible(False, off.group(1), off.span(1))
            return
        found = at_message(P.MEMORY_AFTER_WARMUP, line, start)
        if found is not None and found.group(7) is not None:
            # The pool is measured after CUDA-graph capture and warmup: "Available KV cache memory" was its
            # upper bound (kv_upper_bound_gib), this is the KV memory vLLM keeps.
            self._extensible(True, "", found.span(7))
            upper = self.record.boot.facts.get("available_kv_gib")
            if upper is not None and "kv_upper_bound_gib" not in self.record.boot.facts:
                self.record.set("kv_upper_bound_gib", upper.value, found.span(8))
            self.record.set_num("warmup_free_gib", found, 1)
            self.record.set_num("warmup_transient_gib", found, 3)
            self.record.set_num("warmup_peak_gib", found, 4)
            self.record.set_num("warmup_kv_blocks", found, 6)
            self.record.set("available_kv_gib", read_number(found.group(7)), found.span(7), replace=True)
            self.record.set_num("requested_memory_gib", found, 8)
            return
        found = at_message(P.EXTENDED, line, start)
        if found is not None:
            self._extensible(True, "", found.span(1))
            self.record.set_num("extended_kv_blocks", found, 1)
            self.record.set_num("extended_kv_gib", found, 2)
            return
        found = at_message(P.REMAPPED, line, start)
        if found is not None:
            self.record.set_num("remapped_kv_blocks_from", found, 1)

    def on_gmu_caps(self, line: str, start: int) -> None:
        found = at_message(P.GMU_CAPS, line, start)
        if found is not None:
            self.record.set_num("gmu_explicit", found, 1)
            self.record.set_num("gmu_caps_gib", found, 2)
            self.record.set_num("gmu_withheld_gib", found, 3)

    def on_bad_flag(self, line: str, start: int) -> None:
        """argparse refused the command line: the flag (and the value) it names."""
        found = P.UNRECOGNIZED_RE.search(line, start) or P.AMBIGUOUS_RE.search(line, start)
        if found is not None:
            self.record.set("bad_flag", found.group(1).rstrip(), found.span(1))
            return
        found = P.INVALID_CHOICE_RE.search(line, start)
        if found is not None:
            self.record.set("bad_flag", found.group(1), found.span(1))
            self.record.set("bad_value", found.group(2), found.span(2))

    def on_graph_estimate(self, line: str, start: int) -> None:
        found = at_message(P.GRAPH_ESTIMATE, line, start)
        if found is not None:
            self.record.set_num("cuda_graph_estimated_gib", found, 1)

    def on_compile(self, line: str, start: int) -> None:
        """compile_cache: "cold" once any graph is compiled (it wins over graphs loaded), else "warm"."""
        cold = P.COMPILE_COLD_RE.search(line, start)
        if cold is not None:
            self.record.set("compile_cache", "cold", cold.span(), replace=True)
            return
        warm = P.COMPILE_WARM_RE.search(line, start)
        if warm is not None:
            self.record.set("compile_cache", "warm", warm.span())  # never replaces a "cold"

    def on_listen(self, line: str, start: int) -> None:
        found = at_message(P.LISTEN_RE, line, start)
        if found is not None:
            group = 1 if found.group(1) is not None else 2
            self.record.set("listen_url", found.group(group), found.span(group))
            self.ready(found.span())

    def on_startup_complete(self, line: str, start: int) -> None:
        found = at_message(P.STARTUP_COMPLETE_RE, line, start)
        if found is not None:
            self.ready(found.span())

    def ready(self, span: tuple[int, int]) -> None:
        if not self.record.boot.ready:
            self.record.touch()
            self.record.boot.ready = True
        self.record.set("server_ready", True, span)

    def on_exception(self, line: str, start: int) -> None:
        """The final exception line is the stated cause of an unknown failure; a generic engine-death
        wrapper does not replace a more telling one."""
        text = line[start:].strip()
        known = failures.match(text)
        current = self.record.boot.facts.get("exception")
        if known is not None and known.kind == "engine_died" and current is not None:
            return
        self.record.set("exception", text[:EXCEPTION_MAX], (start, len(line)), replace=True)
