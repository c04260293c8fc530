"""Aids for tests and for trying autotune without a GPU: a tiny local model (and, later, a replaying vLLM)."""
