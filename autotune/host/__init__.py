"""The host: this machine's GPUs and memory."""
