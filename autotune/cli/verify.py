"""`autotune verify URL... [--run RUN]`: check what was deployed (wiring and rendering; the work is run/deployed.py)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from autotune.cli.exitcodes import ExitCode, exit_code_of, exits
from autotune.cli.formats import fmt_duration
from autotune.cli.options import request_option, sayer, written_runs_dir_option
from autotune.cli.progress import probe_answered, probe_sent
from autotune.cli.records import load_one
from autotune.cli.summary import probe_lines
from autotune.events import Renderer
from autotune.store.record import ProbeResult, Result, RunRecord
from autotune.vllm.versions import NO_FULL_ISL_FLAG

INTERRUPTED = "the endpoints checked before were recorded, the one being checked was not"


def endpoints_of(urls: tuple[str, ...], endpoints_file: Path | None) -> list[str]:
    """The URLs given, then those of the file (one a line; blank lines and # comments skipped)."""
    found = list(urls)
    if endpoints_file is not None:
        for line in endpoints_file.read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                found.append(line)
    return found


def could_line(deployment: dict) -> str | None:
    """What the server's KV pool could serve, when it serves less; None when there is nothing to say.
    The length advised never passes the model's own maximum where its files tell it: vLLM refuses more."""
    room = deployment.get("room") or {}
    served, maximum = (deployment.get(key) for key in ("served_max_model_len", "model_maximum"))
    longest, pool = room.get("max_model_len"), room.get("pool_tokens")
    if not pool or served is None:
        return None
    head = f"serves {served:,}; its KV pool holds {pool:,} tokens"
    if longest is None:
        return f"{head}: which length fits, /metrics cannot say ({room.get('why')}); measure it with autotune --target"
    if maximum and longest > maximum:
        if served >= maximum:
            return f"serves {served:,}, the model's own maximum; its KV pool holds {pool:,} tokens: the rest is " \
                   "room for concurrent requests"
        return (f"{head}, more than the model's own maximum of {maximum:,}: restart with --max-model-len {maximum} "
                f"(or verify it first with `autotune --target {maximum} -- YOUR SERVE COMMAND`)")
    if served > longest:  # only where a request longer than the pool is never admitted (could_serve.py)
        return (f"{head}: a request longer than {longest:,} tokens waits in vLLM's queue forever: restart with "
                f"--max-model-len {longest} (or add {NO_FULL_ISL_FLAG} and verify {served:,} with "
                f"`autotune --target {served} -- YOUR SERVE COMMAND`)")
    if served == longest:
        return f"{head}: {served:,} is all vLLM accepts from it"
    unknown = "" if maximum else " if the model allows it (its config.json is not on this machine to say)"
    return (f"{head}: restart with --max-model-len {longest}{unknown} (or verify it first with "
            f"`autotune --target {longest} -- YOUR SERVE COMMAND`)")


def render(record: RunRecord) -> str:
    """One endpoint's card (pure)."""
    d = record.deployment or {}
    result = record.result if isinstance(record.result, Result) else Result()
    verdict, url = result.verdict, d.get("url")
    head = {"verified": "Verified", "not_verified": "Not verified", "front_door": "Turned away",
            "error": "Not reached"}.get(verdict, str(verdict))
    lines = [f"{head}: {url} {result.reason}."] if verdict in ("verified", "not_verified") else [
        f"{head}: {result.reason}"]
    if d.get("model"):
        root = f" ({d['root']})" if d.get("root") not in (None, d["model"]) else ""
        lines.append(f"  model:    {d['model']}{root}")
    if d.get("vllm_version"):
        lines.append(f"  vLLM:     {d['vllm_version']}")
    cache = (d.get("metrics") or {}).get("cache_config") or {}
    if cache.get("num_gpu_blocks"):
        extra = (f", --kv-cache-memory-bytes {cache['kv_cache_memory_bytes'] / 2**20:g} MiB"
                 if cache.get("kv_cache_memory_bytes")
                 else f", gmu {cache['gpu_memory_utilization']:g}" if cache.get("gpu_memory_utilization") else "")
        lines.append(f"  pool:     {cache['num_gpu_blocks']:,} blocks of {cache['block_size']} tokens{extra} "
                     "(vllm:cache_config_info)")
    elif d.get("metrics_unavailable"):
        lines.append(f"  pool:     unknown: {d['metrics_unavailable']}")
    could = could_line(d)
    if could:
        lines.append(f"  could:    {could}")
        lines.append(f"  how sure: {(d.get('room') or {}).get('certainty')}: {(d.get('room') or {}).get('why')}")
    probe = result.probe
    if isinstance(probe, ProbeResult):
        lines.extend(probe_lines(probe))
        unread = (probe.memory or {}).get("unavailable_reason")
        if unread:
            lines.append(f"            memory not read: {unread}")
    for warning in d.get("warnings") or []:
        lines.append(f"  Warning: {warning}")
    took = f" in {fmt_duration(record.duration_s)}" if isinstance(record.duration_s, (int, float)) else ""
    lines.append(f"  recorded: {record.run_id}{took}" + (f" (verifies {d['verifies']})" if d.get("verifies") else ""))
    return "\n".join(lines)


def fleet_code(records: list[RunRecord]) -> int:
    """The exit code of several endpoints: 0 when all verified, else the first one's that did not."""
    for record in records:
        code = exit_code_of(record)
        if code != ExitCode.OK:
            return code
    return ExitCode.OK


@click.command("verify")
@click.argument("urls", nargs=-1, metavar="URL...")
@click.option("--run", "run_ref", metavar="RUN",
              help="The run whose verified ceiling the endpoints should serve (a run id, its folder, or latest); "
                   "without it, each endpoint's served length is probed and its KV pool read.")
@click.option("--endpoints", "endpoints_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="A file of endpoint URLs, one a line (# starts a comment): a fleet.")
@request_option("probe",
              help="The requests sent at the run's ceiling (or the served length): quick = one near-ceiling "
                   "request, timed; full = also a repeat and a short request during its prefill (head-of-line "
                   "wait); none = only read what the server says.")
@click.option("--ssl-ca-certs", type=click.Path(exists=True, dir_okay=False),
              help="For https: the CA that signed the servers' certificates, when the system does not trust it.")
@click.option("--json", "json_", is_flag=True, help="Print the verification runs (a JSON list, one per endpoint).")
@click.option("--quiet", "-q", is_flag=True, help="No progress; only the cards and errors.")
@written_runs_dir_option
def verify(urls, run_ref, endpoints_file, probe, ssl_ca_certs, json_, quiet, runs_dir):
    """Check what was deployed: ask each URL what it serves and prove it with real requests.

    \b
    URL is a vLLM server as its clients reach it (http://HOST:PORT, https://HOST/root);
    its API key is taken from VLLM_API_KEY. For each endpoint autotune reads
    /v1/models (model, served --max-model-len), /version and /metrics (its KV pool), then:
      with --run RUN  compares the served length with the run's verified ceiling (below it:
                      exit 4 with both numbers) and probes the run's length;
      without         probes the served length and says what the pool could serve:
                      "serves 8,192; its KV pool holds 16,384 tokens: restart with
                      --max-model-len 16256".
    A length advised never passes the model's own maximum (its config.json where it is
    on this machine, else as RUN found it). A server of another model than RUN's is not verified,
    whatever it serves. Each endpoint is recorded as a verification run (kind verify, its
    folder TIME-check-MODEL) linked to RUN, so `autotune show RUN` says "deployed at URL,
    verified DATE, vLLM X" and `autotune runs` lists the check under RUN.

    \b
    Exit codes (tune's): 0 verified; 1 bad input (an unknown run, a run with no verified
    ceiling, a URL that is not a server's); 2 no URL given; 3 an endpoint did not answer as
    vLLM does; 4 it serves less than the run verified, or another model, or the probe failed; 9 it turned
    autotune away (API key, TLS). With several endpoints: the code of the first that did not
    verify.
    """
    from autotune.host.signals import interruptible
    from autotune.run import deployed
    from autotune.server import client

    targets = endpoints_of(urls, endpoints_file)
    if not targets:
        raise click.UsageError("give at least one URL (or --endpoints FILE)")
    run = _the_run(run_ref, runs_dir)
    say = sayer(quiet)
    records = []
    with exits(INTERRUPTED), interruptible():  # Ctrl-C in a long probe: a line and 130, no traceback
        doors = [client.door_for_url(url, os.environ, ssl_ca_certs) for url in targets]  # bad URLs: exit 1 first
        probe_progress = ProbeProgress(say)
        for door in doors:
            records.append(deployed.check(door, run, probe, runs_dir, probe_progress))
            if not json_:
                click.echo(render(records[-1]))
    if json_:
        click.echo(json.dumps([r.to_dict() for r in records], indent=2, ensure_ascii=False))
    sys.exit(fleet_code(records))


def _the_run(ref: str | None, runs_dir: Path) -> RunRecord | None:
    if ref is None:
        return None
    _, run = load_one(ref, runs_dir)
    if not (isinstance(run.result, Result) and run.result.verified and run.result.ceiling):
        raise click.ClickException(f"run {run.run_id} has no verified ceiling to compare with "
                                   f"(verdict: {(run.result or Result()).verdict or run.state})")
    return run


class ProbeProgress(Renderer):
    """The progress of `autotune verify` (the probe's requests) as lines on stderr, worded as a tune's."""

    def __init__(self, say):
        self.say = say

    def on_message(self, event: str, message: str, level: str) -> None:
        self.say(message)

    def on_probe_request(self, **d) -> None:
        self.say(probe_sent(**d))

    def on_probe_request_done(self, **d) -> None:
        self.say(probe_answered(**d))


COMMANDS = [verify]
