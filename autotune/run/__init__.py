"""The run: the tune loop and what it composes (strategy, recovery, levers, boot, preflight, sweeps)."""
