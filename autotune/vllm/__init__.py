"""vLLM knowledge: the log grammar, the failure catalog, the serve-command reader, what each version does, its KV accounting."""
