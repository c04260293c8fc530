"""The model's own files, read locally (never downloaded): config.json, tokenizer_config.json, safetensors
headers, the KV cache's shape per layer, and the maximum length vLLM derives from them."""
