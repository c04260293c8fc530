"""The command line's root: the `autotune` group and the registration of its commands.

Each command lives in its own module (cli/tune.py, cli/parse.py, ...); the options they
share are in cli/options.py, the exit codes and the one mapping from exceptions to them
in cli/exitcodes.py (docs/exit-codes.md). Results go to stdout, progress and diagnostics
to stderr.
"""

from __future__ import annotations

import importlib

import click

from autotune import __version__
from autotune.cli import strict


class AutotuneGroup(click.Group):
    """`autotune --target N -- CMD` is short for `autotune tune --target N -- CMD`; options before a
    command name are that command's (`autotune --runs-dir X compare`); see cli/strict.py."""

    def parse_args(self, ctx, args):
        args = strict.route(args, self.commands)
        if args and args[0] in ("tune", "sweep"):
            strict.check_not_a_command(strict.serve_command_of(args[1:], self.commands[args[0]]), self.commands)
            for warning in strict.options_after_dashes(args[1:], self.commands[args[0]]):
                click.echo(warning, err=True)
        return super().parse_args(ctx, args)


@click.group(cls=AutotuneGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="autotune")
def cli():
    """Find the largest context a vLLM server can really serve here, prove it, keep the proof.

    \b
    Tune (the default command): wrap your own serve command after `--`:
      autotune --target 64K -- vllm serve Qwen/Qwen3-8B --gpu-memory-utilization 0.95
    autotune boots it at the target; if vLLM refuses, it relaunches at the ceiling vLLM
    reports, waits until the server answers, checks /v1/models, and writes
    runs/<run-id>/ with run.json, the logs, command.sh and vllm-config.yaml.

    \b
    Read a boot log:        autotune parse vllm.log --json
    Rerun the last command: autotune --target 64K
    """


# The command modules, in the order of `autotune --help`; each exposes COMMANDS, a list of click
# commands. To add a command, write its module and name it here.
COMMAND_MODULES: list[str] = ["tune", "parse", "clean", "resume", "compare", "predict", "sweep", "reproduce",
                              "show", "verify", "gpus", "stop", "fleet"]


def _register_commands() -> None:
    for name in COMMAND_MODULES:
        module = importlib.import_module(f"autotune.cli.{name}")
        for command in module.COMMANDS:
            cli.add_command(command)


_register_commands()


def main() -> None:
    cli(prog_name="autotune")


if __name__ == "__main__":
    main()
