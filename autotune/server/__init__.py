"""A running vLLM over HTTP: the client and its front door, health and serving checks, /metrics, the probe."""
