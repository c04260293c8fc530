"""Build tiny local models: random weights and a byte-level BPE tokenizer, in a second or two.

No model can be downloaded here (and a demo should not need one), so the demo and the
end-to-end tests serve models built locally. The default (`build`) is a Llama whose KV cost is
easy to check by hand: 4 layers x 8 KV heads x 64 head dim x 2 (K and V) x 2 bytes (bf16)
= 8 KiB per token, so `--kv-cache-memory-bytes 128M` holds 16,384 tokens.
`max_position_embeddings` is large (1M) so the model's own limit never caps the search.

Other attention kinds, for the predictor's checks against real vLLM (autotune.model.files):
`build_kind(DIR, KIND)` with KIND one of KINDS:
  gqa      Llama, 8 query heads sharing 4 KV heads (grouped-query attention)
  sliding  Gemma-3 text: 5 sliding-window layers (window 256) to 1 full-attention layer
  mla      DeepSeek-V2 multi-head latent attention (kv_lora_rank 496 + qk_rope_head_dim 16), dense MLP
  hybrid   Qwen3-Next: 3 gated-delta-net linear-attention layers to 1 full-attention layer, 4 tiny experts
           (vLLM's Qwen3-Next needs at least one MoE layer)
They share the tokenizer; their shapes are small but keep each kind's structure, and each keeps
4 KiB of KV per token in the layers that hold every token: a KV cache of 1.5-3 GiB (large enough
that vLLM's two-decimal GiB figures cost little) then holds fewer than the model's 1M tokens.

Needs `transformers` and `tokenizers` (installed with the `cpu` extra); autotune itself does not.
Run: python -m autotune.testing.tiny_model DIR [KIND]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

LAYERS = 4
HIDDEN = 512
HEADS = 8
KV_HEADS = 8
VOCAB = 512
MAX_POSITIONS = 1_048_576
KV_BYTES_PER_TOKEN = 2 * LAYERS * KV_HEADS * (HIDDEN // HEADS) * 2  # K+V, bf16

KINDS = ("llama", "gqa", "sliding", "mla", "hybrid")

# Training text for the tokenizer: varied enough that any probe text tokenizes to
# a predictable number of tokens; byte-level BPE can encode any input anyway.
_CORPUS = [
    "autotune finds the largest context a vLLM server can really serve on this machine.",
    "The quick brown fox jumps over the lazy dog while the KV cache fills up slowly.",
    "Memory is shared between weights, activations and the KV cache; the refusal says how much.",
    "0123456789 , . ; : ! ? - ( ) [ ] { } ' \" / \\ @ # $ % ^ & * + = < > ~ `",
]


def build(out_dir: str | Path) -> Path:
    """Write the default tiny Llama (config, random weights, tokenizer) to out_dir (idempotent)."""
    return build_kind(out_dir, "llama")


def build_kind(out_dir: str | Path, kind: str) -> Path:
    """Write a tiny model of one attention kind (see KINDS) to out_dir (idempotent); return the path."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; one of {', '.join(KINDS)}")
    out = Path(out_dir)
    if (out / "config.json").exists() and (out / "tokenizer.json").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    import torch

    fast = _write_tokenizer(out)
    common = dict(vocab_size=len(fast), bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id,
                  tie_word_embeddings=True, torch_dtype="bfloat16")
    config_cls, model_cls, shape = _KIND_BUILDERS[kind]()
    config = config_cls(**shape, **common)
    torch.manual_seed(0)
    model = model_cls(config).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    what = ("random-weight tiny Llama built by autotune.testing.tiny_model for the demo and tests" if kind == "llama"
            else f"random-weight tiny {config.model_type} ({kind} attention) built by autotune.testing.tiny_model")
    facts = {"what": what, "kind": kind, "max_position_embeddings": config.max_position_embeddings}
    if kind == "llama":
        facts["kv_bytes_per_token"] = KV_BYTES_PER_TOKEN
    (out / "autotune-demo-model.json").write_text(json.dumps(facts, indent=2) + "\n")
    return out


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaConfig, LlamaForCausalLM, dict(
        hidden_size=HIDDEN, intermediate_size=HIDDEN * 2, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS, max_position_embeddings=MAX_POSITIONS)


def _gqa():
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaConfig, LlamaForCausalLM, dict(
        hidden_size=HIDDEN, intermediate_size=HIDDEN * 2, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
        num_key_value_heads=4, max_position_embeddings=MAX_POSITIONS)


def _sliding():
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    layers = 6
    return Gemma3TextConfig, Gemma3ForCausalLM, dict(
        hidden_size=256, intermediate_size=512, num_hidden_layers=layers, num_attention_heads=8,
        num_key_value_heads=8, head_dim=128, sliding_window=256, max_position_embeddings=MAX_POSITIONS,
        layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(layers)])


def _mla():
    from transformers import DeepseekV2Config, DeepseekV2ForCausalLM

    return DeepseekV2Config, DeepseekV2ForCausalLM, dict(
        hidden_size=256, intermediate_size=512, moe_intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=496, q_lora_rank=None, qk_rope_head_dim=16,
        qk_nope_head_dim=32, v_head_dim=32, head_dim=16, first_k_dense_replace=4, n_routed_experts=4,
        num_experts_per_tok=2, n_shared_experts=1, max_position_embeddings=MAX_POSITIONS)


def _hybrid():
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    layers = 4
    return Qwen3NextConfig, Qwen3NextForCausalLM, dict(
        hidden_size=256, intermediate_size=512, moe_intermediate_size=128, shared_expert_intermediate_size=128,
        num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=8, head_dim=128,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=32,
        linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2, mlp_only_layers=[],
        layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)],
        max_position_embeddings=MAX_POSITIONS)


_KIND_BUILDERS = {"llama": _llama, "gqa": _gqa, "sliding": _sliding, "mla": _mla, "hybrid": _hybrid}


def _write_tokenizer(out: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 20, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    # A minimal chat template, so /v1/chat/completions works too.
    fast.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )
    fast.save_pretrained(out)
    return fast


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (1, 2) or (len(args) == 2 and args[1] not in KINDS):
        print(f"usage: python -m autotune.testing.tiny_model DIR [{'|'.join(KINDS)}]", file=sys.stderr)
        return 2
    path = build_kind(args[0], args[1] if len(args) == 2 else "llama")
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
