"""The replaying vLLM's KV sizing as vLLM 0.34 does it (fake_vllm.Boot hands a 0.34 boot here): with the
extensible KV cache (sizing_v034), the first check and `auto` against the upper bound, CUDA-graph capture,
"Memory after warmup", the second check (or fit) against the measured pool, "Extended KV cache" and the
KV line; without it (a flag rules it out, or the driver lacks VMM: "Disabling the extensible KV cache"),
the older sizing with 0.34's words. The advice in a refusal is _more_kv_cache_memory_hint's
(vllm/v1/core/kv_cache_planning.py in the 0.34.0 sdist).
"""

from __future__ import annotations

import math

from autotune.testing import profiles, sizing_v034
from autotune.testing.profiles import GIB

AUTO_FIT_SHORT = 8192  # AUTO_FIT_SHORT_MAX_MODEL_LEN
_PLAIN_HINT = ("Try increasing `gpu_memory_utilization` when initializing the engine (this flag also controls CPU "
               "memory reservation on the CPU backend, despite its name).")


def hint(on: bool, after_warmup: bool, gmu: float) -> str:
    """_more_kv_cache_memory_hint: how to make room, by the extensible KV cache's state and the check."""
    if not on:
        return _PLAIN_HINT
    used_by = "the model, its activations, CUDA graphs and warmup" if after_warmup else "the model and its activations"
    graphs = (" CUDA graphs take less with fewer or smaller capture sizes in the compilation config."
              if after_warmup else "")
    if gmu < 1.0:
        return (f"The KV cache gets what is left after {used_by} within `gpu_memory_utilization`={gmu}; increase it "
                "(with the extensible KV cache it defaults to 1.0) or decrease `max_model_len` or `max_num_seqs`."
                + graphs)
    return (f"The extensible KV cache already takes all device memory left after {used_by}; decrease "
            f"`max_model_len` or `max_num_seqs`, or the model needs a device with more memory.{graphs}")


def kv(boot, length: int):
    """The sizing part of a 0.34 boot: (served length, KV tokens) when it boots, else the exit status."""
    p, s, req = boot.p, boot.req.settings, boot.req
    on, why, said = sizing_v034.state(p, req.options, s.kv_cache_memory_bytes)
    boot.figures.update(off_reason=why, note="" if not on else "; the final length is set after CUDA graph "
                        "capture and warmup")
    if said:
        boot.say("extensible_off")
    if not on:
        return _without(boot, length)
    explicit = any(k in req.options for k in ("gpu-memory-utilization", "device-memory-utilization"))
    w = sizing_v034.warmup(p, s, int(req.busy_gib * GIB), explicit)
    room = profiles.check_bytes(p, s, w.upper)
    boot.figures.update(avail=_gib(max(w.upper, 0)), room=_gib(max(room, 0)))
    boot.per_rank("available")
    checked = _check(boot, length, room, on, after_warmup=False)
    if isinstance(checked, int) and checked <= 0:
        return -checked
    length = checked
    boot.sleep(p.boot_s * 0.1)
    boot.per_rank("capture")
    if w.withheld:
        boot.figures.update(gmu_shown=f"{s.gmu}", w_requested=_gib(w.requested), w_withheld=_gib(w.withheld))
        boot.per_rank("gmu_caps")
    boot.figures.update(w_free=_gib(w.free), w_committed=_gib(w.committed), w_peak=_gib(w.peak), w_blocks=w.blocks,
                        w_pool=_gib(w.pool), w_requested=_gib(w.requested), w_torch=_gib(w.torch_limit),
                        w_pool2=f"{w.pool / GIB:.2f}")
    boot.per_rank("warmup")
    room = profiles.check_bytes(p, s, w.pool)
    boot.figures.update(room=_gib(max(room, 0)), left="left for the KV cache after CUDA graph capture and warmup")
    checked = _check(boot, length, room, on, after_warmup=True)
    if checked <= 0:
        return -checked
    boot.per_rank("extended")
    return _served(boot, checked, w.pool)


def _without(boot, length: int):
    """0.34 without the extensible KV cache: profiling estimates (the CUDA-graph one too), one check, at
    this boot's length (what grows with it: profiles.length_bytes)."""
    p, s, req = boot.p, boot.req.settings, boot.req
    available = profiles.available_kv_bytes(p, s, length)
    if s.kv_cache_memory_bytes is None:
        available -= int(req.busy_gib * GIB)
    room = profiles.check_bytes(p, s, available)
    eq = s.gmu - p.cudagraph_gib / p.gpu_memory_gib
    boot.figures.update(avail=_gib(max(available, 0)), room=_gib(max(room, 0)), gmu4=f"{s.gmu:.4f}",
                        gmu_eq=f"{eq:.4f}", gmu_up=f"{min(s.gmu + (s.gmu - eq), 1.0):.4f}",
                        left="available for the KV cache")
    boot.per_rank("available")
    if p.cudagraph_gib > 0 and s.kv_cache_memory_bytes is None:
        boot.per_rank("cg_enabled")
    checked = _check(boot, length, room, False, after_warmup=True)
    if checked <= 0:
        return -checked
    result = _served(boot, checked, available)
    boot.sleep(p.boot_s * 0.1)
    boot.per_rank("capture")
    return result


def _check(boot, length: int, room: int, on: bool, after_warmup: bool) -> int:
    """vLLM's check (or fit) of the length against `room`: the length that goes on, or minus the exit status.
    A first fit under the extensible KV cache is tentative; the last one (after_warmup) is final."""
    p, s, req = boot.p, boot.req.settings, boot.req
    boot.figures.update(hint=hint(on, after_warmup and on, s.gmu))
    if room <= 0:
        return -boot.fail("no_memory")
    if req.max_model_len == "auto":
        fitted = profiles.estimate(p, s, room, length)
        if fitted <= 0:
            return -boot.fail("no_memory")
        boot.figures.update(fit=fitted, fit_from=length,
                            short_hint="Increase `gpu_memory_utilization` or set --max-model-len explicitly."
                            if s.gmu < 1.0 else "Use more GPUs or set --max-model-len explicitly.")
        if not after_warmup:  # tentative (extensible, before warmup)
            boot.say("autofit_full" if fitted >= length else "autofit_reduced")
        elif fitted >= length:
            boot.say("autofit_using" if on else "autofit_full")
        else:
            boot.say("autofit_final" if fitted >= AUTO_FIT_SHORT else "autofit_short")
        return fitted
    need = profiles.needed_bytes(p, s, length)
    if need > room:
        est = profiles.estimate(p, s, room, length)
        boot.figures.update(need=_gib(need), est=est,
                            estimate_msg=boot.family["estimate_msg"].format(est=est) if est > 0 else "")
        boot.say("refusal")
        boot.say("failed_tail")
        return -1
    return length


def _served(boot, length: int, pool: int):
    p, s, req = boot.p, boot.req.settings, boot.req
    tokens = profiles.kv_cache_tokens(p, s, pool)
    conc = (tokens // p.block_size) / math.ceil(length / p.block_size)
    boot.figures.update(L=length, L_c=f"{length:,}", tokens_c=f"{tokens:,}", conc=f"{conc:.2f}", concurrency=conc)
    boot.say("kv")
    blocks = profiles.mamba_blocks(p, s, pool)
    if blocks is not None and blocks < profiles.max_num_seqs(p, s):
        return boot.fail("mamba", seqs=profiles.max_num_seqs(p, s), blocks=blocks)
    served = length if (req.max_model_len != "auto" or boot.family["serves_fitted_length"]) else p.derived_max_len
    return served, tokens


def _gib(value_bytes: float) -> str:
    return f"{round(value_bytes / GIB, 2)}"
