"""A fleet plan (PLAN.yaml) read into leaves: each leaf is one `autotune tune`, unchanged.

    name: seed-sweep                      # optional; default: the file's stem
    command: python -m vllm.entrypoints.openai.api_server --model {model} --max-num-seqs 1
    models: [Qwen/Qwen3-8B, meta-llama/Llama-3.1-8B-Instruct]   # each substituted for {model}
    target: 64K
    strategy: refusal                     # auto | refusal (tune's --strategy)
    probe: quick                          # quick | full | none (tune's --probe)
    grid:                                 # flag -> values: every combination is one leaf
      --gpu-memory-utilization: [0.90, 0.95]
      --max-num-seqs: [1, 8]
    gpus_per_leaf: 1                      # default: tensor x pipeline parallel size of the command
    accelerator: H100                     # a GPU type (Ray's ray.io/accelerator-type label)
    env: {VLLM_LOGGING_LEVEL: INFO}
    vllm:                                 # optional: a version matrix, one vLLM environment per leaf
      - {venv: /opt/vllm-0.31, version: 0.31.0}
      - {venv: /opt/vllm-0.32, version: 0.32.0}

`command` is one command (a string, split as a shell would, or a list of strings of which each is
a command; a list of lists is a list of argv lists). `leaves` is the explicit alternative to
`grid`: a list of mappings of flag -> value (a flag's `true` adds it alone, `false` removes it),
each also allowed `command` (its own serve command), `model`, `target`, `accelerator`,
`gpus_per_leaf`, `env`. A flag is written as on the command line (`--gpu-memory-utilization`) or
as vLLM's config files write it (`gpu-memory-utilization`, `gpu_memory_utilization`), in `grid`
and in `leaves` alike.

Every mistake is a PlanError naming the file, the line and the key, raised before anything
boots. Pure: reading the file is the only I/O.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from autotune.analysis import ranks
from autotune.errors import AutotuneError
from autotune.vllm import serve_options, servecmd

KEYS = ("name", "command", "models", "target", "strategy", "probe", "grid", "leaves", "gpus_per_leaf",
        "accelerator", "env", "vllm", "max_boots", "stall_timeout")
LEAF_KEYS = ("command", "model", "target", "accelerator", "gpus_per_leaf", "env")
STRATEGIES = ("auto", "refusal")
PROBES = ("quick", "full", "none")
MODEL_SLOT = "{model}"


class PlanError(AutotuneError, ValueError):
    """A plan that cannot be run: the message names the file, line and key."""


@dataclass(frozen=True)
class VllmEnv:
    """One vLLM environment of the version matrix: a venv whose bin/ holds python and vllm."""

    venv: str | None = None
    version: str | None = None  # the image tag of `fleet render --k8s` (vllm/vllm-openai:v<version>)

    def argv(self, argv: list[str]) -> list[str]:
        """The command with its program taken from this venv (python, python3, vllm)."""
        if not self.venv or not argv:
            return list(argv)
        program = Path(argv[0]).name
        if program in ("python", "python3", "vllm") or program.startswith("python3."):
            return [str(Path(self.venv) / "bin" / program), *argv[1:]]
        return list(argv)


@dataclass
class Leaf:
    """One tune of the fleet."""

    index: int  # 1, 2, ... in plan order
    argv: list[str]  # the serve command, as tune gets it after `--`
    target: int | str  # a length, or "max"
    strategy: str
    probe: str
    gpus_per_leaf: int
    accelerator: str | None
    env: dict[str, str]
    vllm: VllmEnv
    model: str | None
    settings: dict[str, str] = field(default_factory=dict)  # what this leaf sets (grid values), for the table
    max_boots: int = 6
    stall_timeout: float = 1200.0

    @property
    def id(self) -> str:
        return f"leaf-{self.index:02d}"

    @property
    def key(self) -> str:
        """What makes it this leaf (not its place in the plan): a second run of the plan skips the
        leaves whose key already finished."""
        data = [self.argv, self.target, self.strategy, self.probe, self.gpus_per_leaf, self.accelerator,
                sorted(self.env.items()), self.vllm.venv, self.max_boots]
        return hashlib.sha1(json.dumps(data, default=str).encode()).hexdigest()[:12]

    def label(self, served: str | None = None) -> str:
        """Short words for tables: the model (served: the one vLLM said, for a command naming none)
        and what the grid set."""
        model = (self.model or servecmd.model_of(self.argv) or served or "?").rstrip("/").split("/")[-1]
        parts = [model, *(f"{k.lstrip('-')}={v}" for k, v in self.settings.items())]
        if self.vllm.version:
            parts.append(f"vLLM {self.vllm.version}")
        return " ".join(parts)

    def to_dict(self) -> dict:
        return {"id": self.id, "key": self.key, "label": self.label(), "argv": self.argv, "target": self.target,
                "strategy": self.strategy, "probe": self.probe, "gpus_per_leaf": self.gpus_per_leaf,
                "accelerator": self.accelerator, "env": self.env, "vllm": {"venv": self.vllm.venv,
                                                                           "version": self.vllm.version},
                "model": self.model, "settings": self.settings, "max_boots": self.max_boots,
                "stall_timeout": self.stall_timeout}


@dataclass
class FleetPlan:
    name: str
    path: str
    leaves: list[Leaf]
    digest: str  # of the plan's text: the same plan run again continues its fleet


# ---- YAML with line numbers ---------------------------------------------------------------------

class _Where:
    """Where each key path of the document is (1-based lines)."""

    def __init__(self, path: str):
        import yaml

        self.path = path
        self.lines: dict[tuple, int] = {}
        self.loader = yaml.SafeLoader("")  # types each scalar as YAML does (0.9 a float, true a bool)

    def error(self, keys: tuple, message: str) -> PlanError:
        line = None
        for n in range(len(keys), -1, -1):
            line = self.lines.get(tuple(keys[:n]))
            if line is not None:
                break
        shown = ".".join(str(k) for k in keys) or "(top)"
        return PlanError(f"{self.path}:{line or 1}: {shown}: {message}")


def _plain(node, keys: tuple, where: _Where):
    import yaml

    where.lines.setdefault(keys, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        out = {}
        for key_node, value_node in node.value:
            key = key_node.value
            if key in out:
                where.lines[(*keys, key)] = key_node.start_mark.line + 1
                raise where.error((*keys, key), "given twice")
            where.lines[(*keys, key)] = key_node.start_mark.line + 1
            out[key] = _plain(value_node, (*keys, key), where)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_plain(item, (*keys, i), where) for i, item in enumerate(node.value)]
    return where.loader.construct_object(node)


def read_yaml(text: str, where: _Where) -> dict:
    import yaml

    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 1
        raise PlanError(f"{where.path}:{line}: not valid YAML: {getattr(exc, 'problem', None) or exc}") from None
    if node is None:
        raise PlanError(f"{where.path}:1: the plan is empty; it needs at least `command` and `target`")
    data = _plain(node, (), where)
    if not isinstance(data, dict):
        raise where.error((), "a plan is a mapping of keys (command, target, grid, ...)")
    return data


# ---- the plan -----------------------------------------------------------------------------------

def load(path: str | Path) -> FleetPlan:
    """The plan at path, every leaf spelled out; PlanError for the first mistake."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PlanError(f"{path}: cannot read the plan ({exc.strerror or exc})") from None
    return parse(text, str(path))


def parse(text: str, source: str = "PLAN.yaml") -> FleetPlan:
    where = _Where(source)
    data = read_yaml(text, where)
    for key in data:
        if key not in KEYS:
            raise where.error((key,), f"unknown key; a plan takes {', '.join(KEYS)}")
    for key in ("command", "target"):
        if key not in data:
            raise where.error((), f"`{key}` is missing")
    if "grid" in data and "leaves" in data:
        raise where.error(("leaves",), "give `grid` or `leaves`, not both")
    common = _common(data, where)
    leaves = []
    for argv, model in _commands(data, where):
        for vllm_env in _vllm_envs(data, where):
            for settings, overrides in _variations(data, where):
                leaves.append(_leaf(len(leaves) + 1, argv, model, vllm_env, settings, overrides, common, where))
    if not leaves:
        raise where.error(("command",), "the plan gives no leaf")
    keys = [leaf.key for leaf in leaves]
    for leaf in leaves:
        if keys.count(leaf.key) > 1:
            raise where.error(("grid" if "grid" in data else "leaves",), f"{leaf.id} ({leaf.label()}) is given twice")
    name = str(data.get("name") or Path(source).stem)
    return FleetPlan(name=name, path=source, leaves=leaves, digest=hashlib.sha1(text.encode()).hexdigest()[:12])


def _common(data: dict, where: _Where) -> dict:
    return {"target": _target(data["target"], ("target",), where),
            "strategy": _choice(data.get("strategy", "auto"), STRATEGIES, ("strategy",), where),
            "probe": _choice(data.get("probe", "quick"), PROBES, ("probe",), where),
            "gpus_per_leaf": _count(data["gpus_per_leaf"], ("gpus_per_leaf",), where) if "gpus_per_leaf" in data else None,
            "accelerator": _text(data.get("accelerator"), ("accelerator",), where),
            "env": _env(data.get("env") or {}, ("env",), where),
            "max_boots": _count(data.get("max_boots", 6), ("max_boots",), where),
            "stall_timeout": _seconds(data.get("stall_timeout", 1200), ("stall_timeout",), where)}


def _commands(data: dict, where: _Where) -> list[tuple[list[str], str | None]]:
    raw = data["command"]
    if isinstance(raw, str):
        commands = [(raw, ("command",))]
    elif isinstance(raw, list) and raw:
        commands = [(c, ("command", i)) for i, c in enumerate(raw)]
    else:
        raise where.error(("command",), "a serve command (a string), or a list of them")
    models = data.get("models")
    if models is not None and (not isinstance(models, list) or not models
                               or not all(isinstance(m, str) and m for m in models)):
        raise where.error(("models",), "a list of model names or paths")
    out = []
    for command, keys in commands:
        argv = _argv(command, keys, where)
        if models is None:
            out.append((argv, None))
            continue
        if not any(MODEL_SLOT in token for token in argv):
            raise where.error(keys, f"`models` is given but the command has no {MODEL_SLOT} to put them in")
        out.extend(([t.replace(MODEL_SLOT, m) for t in argv], m) for m in models)
    return out


def _argv(command, keys: tuple, where: _Where) -> list[str]:
    if isinstance(command, list) and command and all(isinstance(t, (str, int, float)) for t in command):
        return [str(t) for t in command]
    if not isinstance(command, str) or not command.strip():
        raise where.error(keys, "a serve command: a string, or a list of its words")
    try:
        return shlex.split(command)
    except ValueError as exc:
        raise where.error(keys, f"cannot be split as a shell would ({exc})") from None


def _vllm_envs(data: dict, where: _Where) -> list[VllmEnv]:
    raw = data.get("vllm")
    if raw is None:
        return [VllmEnv()]
    items = raw if isinstance(raw, list) else [raw]
    envs = []
    for i, item in enumerate(items):
        keys = ("vllm", i) if isinstance(raw, list) else ("vllm",)
        if isinstance(item, str):
            item = {"venv": item}
        if not isinstance(item, dict) or not set(item) <= {"venv", "version"} or not item:
            raise where.error(keys, "a venv path, or a mapping with `venv` and/or `version`")
        envs.append(VllmEnv(venv=_text(item.get("venv"), (*keys, "venv"), where),
                            version=_text(item.get("version"), (*keys, "version"), where)))
    return envs


def _variations(data: dict, where: _Where) -> list[tuple[dict, dict]]:
    """(flag -> value, the leaf's own keys) for each leaf of one command."""
    if "leaves" in data:
        raw = data["leaves"]
        if not isinstance(raw, list) or not raw:
            raise where.error(("leaves",), "a list of mappings (flag -> value, and model/target/env/...)")
        out = []
        for i, item in enumerate(raw):
            if not isinstance(item, dict):
                raise where.error(("leaves", i), "a mapping of flag -> value (and model/target/env/...)")
            own = {k: v for k, v in item.items() if k in LEAF_KEYS}
            flags = _flag_keys({k: v for k, v in item.items() if k not in LEAF_KEYS}, ("leaves", i), where,
                               f"a leaf takes serve flags (--name, name or name_with_underscores, as vLLM's "
                               f"config files write them) and {', '.join(LEAF_KEYS)}")
            out.append((_flags(flags, ("leaves", i), where), {"keys": ("leaves", i), **own}))
        return out
    grid = data.get("grid") or {}
    if not isinstance(grid, dict):
        raise where.error(("grid",), "a mapping of flag -> list of values")
    axes = []
    grid = _flag_keys(grid, ("grid",), where, "a grid key is a serve flag: --gpu-memory-utilization, or as vLLM's "
                                              "config files write it, gpu-memory-utilization or gpu_memory_utilization")
    for flag, values in grid.items():
        if not isinstance(values, list) or not values:
            raise where.error(("grid", flag), "a list of values")
        axes.append([(flag, _flag_value(v, ("grid", flag, i), where)) for i, v in enumerate(values)])
    return [(dict(combo), {}) for combo in itertools.product(*axes)] if axes else [({}, {})]


def _flag_keys(items: dict, keys: tuple, where: _Where, what: str) -> dict:
    """Flag -> value with each key as a flag: `--gpu-memory-utilization` as written, and vLLM's config-file
    forms (`gpu-memory-utilization`, `gpu_memory_utilization`: `vllm serve --config` reads a key as --key)."""
    out: dict = {}
    for key, value in items.items():
        text = str(key)
        bare = text.replace("_", "-")
        if not text.startswith("--") and bare not in serve_options.LONG:  # vLLM's own option names, no guessing
            raise where.error((*keys, key), what)
        flag = text if text.startswith("--") else "--" + bare
        same = next((k for k in out if servecmd.canonical_name(k[2:]) == servecmd.canonical_name(flag[2:])), None)
        if same is not None:
            raise where.error((*keys, key), f"the same flag as {same}: give it once")
        out[flag] = value
    return out


def _flags(flags: dict, keys: tuple, where: _Where) -> dict:
    return {flag: _flag_value(v, (*keys, flag), where) for flag, v in flags.items()}


def _flag_value(value, keys: tuple, where: _Where):
    if isinstance(value, (bool, int, float, str)):
        return value
    raise where.error(keys, "a flag's value is a number, a string, or true/false")


def _leaf(index: int, argv: list[str], model: str | None, vllm_env: VllmEnv, settings: dict, overrides: dict,
          common: dict, where: _Where) -> Leaf:
    keys = overrides.pop("keys", ())
    if "command" in overrides:  # a leaf of its own command (another program, another model)
        argv = _argv(overrides["command"], (*keys, "command"), where)
    for flag, value in settings.items():
        if flag in (servecmd.MAX_MODEL_LEN, servecmd.PORT):
            raise where.error((*keys, flag) if keys else ("grid", flag), f"autotune sets {flag} itself")
        if value is False:
            argv = servecmd.without_flag(argv, flag)
        elif value is True:
            argv = [*servecmd.without_flag(argv, flag), flag]
        else:
            argv = servecmd.with_flag(argv, flag, value)
    if "model" in overrides:
        model = _text(overrides["model"], (*keys, "model"), where)
        argv = servecmd.with_flag(argv, "--model", model) if servecmd.flag_value(argv, "--model") else \
            [t.replace(MODEL_SLOT, model) for t in argv]
    if any(MODEL_SLOT in t for t in argv):
        raise where.error(("command",), f"{MODEL_SLOT} is in the command but no `models` (or leaf `model`) fills it")
    target = _target(overrides["target"], (*keys, "target"), where) if "target" in overrides else common["target"]
    gpus = overrides.get("gpus_per_leaf", common["gpus_per_leaf"])
    if gpus is None:
        tp, pp = ranks.parallel_sizes(argv)
        gpus = tp * pp
    gpus = _count(gpus, (*keys, "gpus_per_leaf") if "gpus_per_leaf" in overrides else ("gpus_per_leaf",), where)
    env = {**common["env"], **_env(overrides.get("env") or {}, (*keys, "env"), where)}
    accelerator = _text(overrides.get("accelerator", common["accelerator"]), (*keys, "accelerator"), where)
    return Leaf(index=index, argv=vllm_env.argv(argv), target=target, strategy=common["strategy"],
                probe=common["probe"], gpus_per_leaf=gpus, accelerator=accelerator, env=env, vllm=vllm_env,
                model=model or servecmd.model_of(argv), settings={k: _shown(v) for k, v in settings.items()},
                max_boots=common["max_boots"], stall_timeout=common["stall_timeout"])


def _shown(value) -> str:
    return "on" if value is True else "off" if value is False else str(value)


def _target(value, keys: tuple, where: _Where) -> int | str:
    if isinstance(value, str) and value.strip().lower() == "max":
        return "max"
    try:
        return servecmd.parse_length(str(value))
    except ValueError as exc:
        raise where.error(keys, str(exc)) from None


def _choice(value, choices: tuple, keys: tuple, where: _Where) -> str:
    if value not in choices:
        raise where.error(keys, f"{value!r} is not one of {', '.join(choices)}")
    return value


def _count(value, keys: tuple, where: _Where) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise where.error(keys, f"{value!r} is not a whole number of at least 1")
    return value


def _seconds(value, keys: tuple, where: _Where) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise where.error(keys, f"{value!r} is not a number of seconds")
    return float(value)


def _text(value, keys: tuple, where: _Where) -> str | None:
    if value is None:
        return None
    if isinstance(value, (dict, list, bool)):
        raise where.error(keys, "a string")
    return str(value)


def _env(value, keys: tuple, where: _Where) -> dict[str, str]:
    if not isinstance(value, dict):
        raise where.error(keys, "a mapping of NAME: value")
    out = {}
    for name, v in value.items():
        if isinstance(v, (dict, list)) or v is None:
            raise where.error((*keys, name), "a string or a number")
        out[str(name)] = "true" if v is True else "false" if v is False else str(v)
    return out
