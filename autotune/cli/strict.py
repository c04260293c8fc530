"""A strict command line (pure over click's objects): where options go, and what is never a program.

`autotune [OPTIONS] COMMAND ...` is read as `autotune COMMAND [OPTIONS] ...`: options written
before the command name are that command's own, so `autotune --runs-dir X compare` is
`autotune compare --runs-dir X`, and one the command does not take is click's usage error
(exit 2, "No such option", the closest match). Without a command name, the line is a tune,
as always. The serve command starts after `--` (or at the first word that is not an option),
and it is never an autotune command name: `autotune --target 64K compare` runs compare
(which refuses --target), and `autotune --target 64K -- compare` is a usage error, not a boot
of a program called compare.
"""

from __future__ import annotations

import click

DEFAULT_COMMAND = "tune"
PASS_THROUGH = ("--help", "-h", "--version")


def value_options(commands: dict[str, click.Command]) -> set[str]:
    """Every option spelling that takes a value, in any command (so its value is not read as a word)."""
    names: set[str] = set()
    for command in commands.values():
        for param in command.params:
            if isinstance(param, click.Option) and not param.is_flag and not param.count:
                names.update(param.opts)
    return names


def route(args: list[str], commands: dict[str, click.Command]) -> list[str]:
    """The arguments with the command name first: `[opts] CMD rest` -> `CMD opts rest`; no name: tune."""
    if not args or args[0] in commands or args[0] in PASS_THROUGH:
        return list(args)
    takes_value = value_options(commands)
    i = 0
    while i < len(args) and args[i] != "--":
        word = args[i]
        if word.startswith("-") and word != "-":
            i += 2 if word in takes_value else 1  # `--opt value`; `--opt=value` and flags are one word
            continue
        if word in commands:
            return [word, *args[:i], *args[i + 1:]]
        break  # the serve command, written without `--`
    return [DEFAULT_COMMAND, *args]


def serve_command_of(args: list[str], command: click.Command) -> list[str]:
    """The serve command a tune or sweep line names: after `--`, or from the first word that is
    neither an option nor an option's value (what click will hand the command)."""
    if "--" in args:
        return args[args.index("--") + 1:]
    takes_value = {name for p in command.params if isinstance(p, click.Option) and not p.is_flag and not p.count
                   for name in p.opts}
    i = 0
    while i < len(args):
        word = args[i]
        if word.startswith("-") and word != "-":
            i += 2 if word in takes_value else 1
            continue
        return args[i:]
    return []


def check_not_a_command(serve_argv: list[str], commands: dict[str, click.Command]) -> None:
    """A serve command that is an autotune command name is a mistake, never a program to launch."""
    if serve_argv and serve_argv[0] in commands:
        name = serve_argv[0]
        raise click.UsageError(f"{name!r} is an autotune command, not a serve command: run `autotune {name} ...` "
                               f"(the serve command after `--` is your vLLM command, e.g. `-- vllm serve MODEL`)")


def options_after_dashes(args: list[str], command: click.Command) -> list[str]:
    """A tune or sweep line's own long options written after `--`, where every word is the serve
    command's: a required one missing before `--` is a usage error that says where it went; each
    other one is a warning (returned), since it reaches vLLM, not autotune."""
    serve = serve_command_of(args, command)
    before = args[:len(args) - len(serve)]
    warnings = []
    for param in command.params:
        if not isinstance(param, click.Option):
            continue
        names = [n for n in param.opts if n.startswith("--") and n != "--help"]
        found = next((i for i, word in enumerate(serve) for n in names if word == n or word.startswith(n + "=")), None)
        if found is None:
            continue
        written = serve[found] if "=" in serve[found] or param.is_flag or found + 1 >= len(serve) \
            else f"{serve[found]} {serve[found + 1]}"
        if param.required and not any(w in names or w.split("=", 1)[0] in names for w in before):
            raise click.UsageError(f"Missing option '{names[0]}': `{written}` is after `--`, where every word is the "
                                   f"serve command's (vLLM would get it); put it before `--`: autotune {written} -- "
                                   f"{' '.join(serve[:2])} ...")
        warnings.append(f"Warning: `{written}` is after `--`, so it goes to the serve command, not to autotune "
                        "(autotune's options go before `--`)")
    return warnings
