"""What the replaying vLLM serves, known without booting it: the oracle autotune's answers are
checked against (tests/testing/test_oracle.py).

``truth(argv, env)`` says, for a serve command of the replaying vLLM, the largest
`--max-model-len` it boots and serves (whatever --max-model-len the command has), what sets that
length, or that no length boots and why. It reads the command as the replay does
(fake_args.read_request) and decides with the replay's own memory model (profiles.py), in the
order its ReplayedBoot meets the checks (fake_vllm.py); tests/testing/test_fake_vllm.py boots the replay at the
truth and one token above it to keep the two in step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from autotune.testing import fake_args, profiles, sizing_v034
from autotune.vllm import versions

# What sets a ceiling that boots: the KV pool, or a limit that is not memory.
KV_CACHE = "kv_cache"
MODEL_MAXIMUM = "model_maximum"  # the model's own maximum (config.json): vLLM's derived max_model_len
DRAFT_MODEL = "draft_model"  # 0.33: the speculative-decoding draft model's max_model_len
BATCHED_TOKENS = "max_num_batched_tokens"  # chunked prefill off: a prompt fits one batch
LIMITS = (KV_CACHE, MODEL_MAXIMUM, DRAFT_MODEL, BATCHED_TOKENS)
# Why no length boots (the replay's failure, by autotune's catalog kind where it has one).
CANNOT_BOOT = ("usage", "cuda_visible_devices_uuid", "batched_tokens_below_max_num_seqs", "fp8_unsupported_arch",
               "negative_available_kv", "mamba_cache_blocks", "nothing_fits")


@dataclass(frozen=True)
class Truth:
    ceiling: int | None  # the largest --max-model-len that boots and is served; None: none boots
    limit: str  # LIMITS (what sets the ceiling) or CANNOT_BOOT (why none boots)
    why: str
    kv_cache_tokens: int | None = None  # the pool vLLM reports at the ceiling
    mamba_blocks: int | None = None  # with mamba_cache_blocks: the sequences whose state fits
    also: tuple[str, ...] = ()  # the other reasons none boots (CANNOT_BOOT), or limits tied at the ceiling

    @property
    def boots(self) -> bool:
        return self.ceiling is not None


def truth(argv: Sequence[str], env: Mapping[str, str] | None = None) -> Truth:
    """The replay's own maximum for this command (a full `python -m autotune.testing.fake_vllm ...`
    argv, or its options alone)."""
    argv = list(argv)
    if versions.replays(argv):
        argv = argv[3:]
    try:
        req = fake_args.read_request(argv, dict(env or {}))
    except fake_args.UsageError as exc:
        return Truth(None, "usage", str(exc))
    failure = _cannot_boot(req)
    if failure is not None:
        return failure
    p, s = req.profile, req.settings
    available = _available(req)
    # What boots, and of it what runs: a request over a sliding-window model's pool is never admitted.
    # Where the pool shrinks as --max-model-len grows, the longest length whose own pool holds it.
    if profiles.pool_moves(p, s):
        fits = profiles.longest_that_boots(p, s, lambda length: _available(req, length))
        available = _available(req, fits or p.block_size)
    else:
        fits = profiles.served_max(p, s, available)
    if fits <= 0:
        return Truth(None, "nothing_fits", "not one block of KV cache fits one request")
    blocks = profiles.mamba_blocks(p, s, available)
    seqs = profiles.max_num_seqs(p, s)
    if blocks is not None and blocks < seqs:
        return Truth(None, "mamba_cache_blocks", f"Mamba state for {blocks} sequences, not {seqs}",
                     mamba_blocks=blocks)
    candidates = [(fits, KV_CACHE, f"the KV pool holds {fits:,} tokens for one request")]
    if fits >= p.derived_max_len:
        candidates.append((p.derived_max_len, MODEL_MAXIMUM, f"the model's own maximum is {p.derived_max_len:,}"))
    draft = profiles.draft_limit(p, req.options)
    if draft is not None:
        candidates.append((draft, DRAFT_MODEL, f"vLLM lowers max_model_len to the draft model's {draft:,}"))
    batched = profiles.batched_limit(p, s, req.options)
    if batched is not None:
        candidates.append((batched, BATCHED_TOKENS, f"chunked prefill is off: one batch of {batched:,} tokens"))
    # The smallest wins; on a tie the limit that is not memory names it (it holds at any gmu).
    ceiling, limit, why = min(candidates, key=lambda c: (c[0], c[1] == KV_CACHE))
    tied = tuple(c[1] for c in candidates if c[0] == ceiling and c[1] not in (limit, KV_CACHE))
    return Truth(ceiling, limit, why, kv_cache_tokens=profiles.kv_cache_tokens(p, s, available), also=tied)


def _cannot_boot(req: fake_args.Request) -> Truth | None:
    """The failures that no --max-model-len avoids: the first the replay meets, and the others."""
    p, s = req.profile, req.settings
    visible = [v.strip() for v in (req.env_visible or "").split(",") if v.strip()]
    found = [(kind, why) for kind, why, when in (
        ("cuda_visible_devices_uuid", f"vLLM {p.version} reads CUDA_VISIBLE_DEVICES as integers",
         any(v.upper().startswith(("GPU-", "MIG-")) for v in visible) and not versions.profile(p.version).gpu_uuids_work),
        ("batched_tokens_below_max_num_seqs", f"max_num_batched_tokens {profiles.batched_tokens(p, s)} < max_num_seqs "
         f"{profiles.max_num_seqs(p, s)}", profiles.batched_tokens(p, s) < profiles.max_num_seqs(p, s)),
        ("fp8_unsupported_arch", f"an fp8 KV cache needs compute capability 8.9, the GPU has {p.compute_capability}",
         s.kv_cache_dtype.startswith("fp8") and not p.fp8_kv_supported),
        ("negative_available_kv", "no memory is left for the KV cache",
         profiles.check_bytes(p, s, _available(req)) <= 0),
    ) if when]
    if not found:
        return None
    return Truth(None, found[0][0], found[0][1], also=tuple(kind for kind, _ in found[1:]))


def _available(req: fake_args.Request, length: int | None = None) -> int:
    """The KV memory the replay's boot at `length` finds: its memory model's, less what another
    process holds (None: the part that does not move with the length)."""
    if extensible_on(req):  # 0.34: the pool measured after CUDA-graph capture and warmup
        return sizing_v034.warmup(req.profile, req.settings, int(req.busy_gib * profiles.GIB)).pool
    available = profiles.available_kv_bytes(req.profile, req.settings, length)
    if req.settings.kv_cache_memory_bytes is None:
        available -= int(req.busy_gib * profiles.GIB)
    return available


def extensible_on(req: fake_args.Request) -> bool:
    """Does this boot size its KV cache with 0.34's extensible KV cache?"""
    return sizing_v034.uses_it(req.profile) and sizing_v034.state(req.profile, req.options,
                                                                 req.settings.kv_cache_memory_bytes)[0]
