"""`python -m autotune.testing.replay_machine PROFILE <autotune arguments>`: autotune as it runs on a
replaying vLLM profile's machine, that profile's GPUs in place of what NVML finds here.

With the replaying vLLM (fake_vllm.py) as the serve command, a whole tune, `--reach`, `compare`,
the paste-ready files and the sizing report see the profile's GPUs (names, memory, compute
capability) as they would on that machine; the tests do the same with Profile.nvml_inventory.
"""

from __future__ import annotations

import sys

from autotune.cli import main as autotune
from autotune.host import machine
from autotune.testing import profiles


def main(argv: list[str]) -> None:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return
    try:
        profile = profiles.by_name(argv[0])
    except KeyError as exc:
        sys.exit(f"replay_machine: {exc.args[0]}")
    machine.gpu_facts = lambda: (profile.nvml_inventory(), None)
    sys.argv = ["autotune", *argv[1:]]
    autotune()


if __name__ == "__main__":
    main(sys.argv[1:])
