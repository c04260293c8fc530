"""autotune: find the largest context a vLLM server can really serve, prove it, keep the proof."""

__version__ = "0.1.0"
