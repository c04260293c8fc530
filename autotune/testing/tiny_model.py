"""Build the embedded default's tiny model: a random-weight Llama and a byte-level BPE tokenizer.

No model can be downloaded here (and a demo should not need one), so the demo and the
end-to-end tests serve a model built locally in a second. Its shape makes the KV cost easy
to check by hand: 4 layers x 8 KV heads x 64 head dim x 2 (K and V) x 2 bytes (bf16)
= 8 KiB per token, so `--kv-cache-memory-bytes 128M` holds 16,384 tokens.
`max_position_embeddings` is large (1M) so the model's own limit never caps the search.

Needs `transformers` and `tokenizers` (installed with the `cpu` extra); autotune itself does not.
Run: python -m autotune.testing.tiny_model DIR
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

# Training text for the tokenizer: varied enough that any probe text tokenizes to
# a predictable number of tokens; byte-level BPE can encode any input anyway.
_CORPUS = [
    "autotune finds the largest context a vLLM server can really serve on this machine.",
    "The quick brown fox jumps over the lazy dog while the KV cache fills up slowly.",
    "Memory is shared between weights, activations and the KV cache; the refusal says how much.",
    "0123456789 , . ; : ! ? - ( ) [ ] { } ' \" / \\ @ # $ % ^ & * + = < > ~ `",
]


def build(out_dir: str | Path) -> Path:
    """Write config, random weights and tokenizer to out_dir (idempotent); return the path."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out = Path(out_dir)
    if (out / "config.json").exists() and (out / "tokenizer.json").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)

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

    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=HIDDEN,
        intermediate_size=HIDDEN * 2,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        tie_word_embeddings=True,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    (out / "autotune-demo-model.json").write_text(
        json.dumps(
            {
                "what": "random-weight tiny Llama built by autotune.testing.tiny_model for the demo and tests",
                "kv_bytes_per_token": KV_BYTES_PER_TOKEN,
                "max_position_embeddings": MAX_POSITIONS,
            },
            indent=2,
        )
        + "\n"
    )
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m autotune.testing.tiny_model DIR", file=sys.stderr)
        return 2
    path = build(args[0])
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
