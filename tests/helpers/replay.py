"""The replaying vLLM (autotune.testing.fake_vllm) as the tests run it: a serve command of a profile,
and one boot in-process with what autotune's parser reads from it."""
import io
import sys

from autotune.testing import fake_vllm
from autotune.vllm.log import parse_lines

SEED = "seed-3090-qwen3.6-27b"
SEED_LEVERS = ["--gpu-memory-utilization", "0.98", "--max-num-seqs", "1", "--max-num-batched-tokens", "512",
               "--enable-chunked-prefill"]
FAST = "0.002"  # of the real seconds: a 90 s boot takes 0.2 s


def fake(profile, *flags, scale=FAST):
    """The serve command of the replaying vLLM playing `profile`."""
    return [sys.executable, "-m", "autotune.testing.fake_vllm", "--profile", profile, "--time-scale", scale, *flags]


def boot(*argv, env=None):
    """(exit status or (served length, KV tokens), parsed result, the lines) of one in-process boot."""
    out = io.StringIO()
    req = fake_vllm.read_request(["--time-scale", "0", *argv], env or {})
    outcome = fake_vllm.ReplayedBoot(req, out).run()
    lines = out.getvalue().splitlines()
    return outcome, parse_lines(lines).result(), lines
