"""The run: the tune loop and what it composes (strategy, recovery, levers, launch, verify, probe, preflight, sweeps)."""
