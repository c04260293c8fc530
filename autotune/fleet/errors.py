"""The fleet's one error for input it cannot run (exit 1, nothing boots)."""

from autotune.errors import AutotuneError


class FleetError(AutotuneError):
    """A fleet that cannot start: no slots, a missing backend, a plan the backend cannot place."""
