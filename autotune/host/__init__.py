"""The host: this machine's GPUs and memory, its processes (start, stop a whole tree) and signals."""
