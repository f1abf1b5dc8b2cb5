"""Typed configuration: pydantic models, YAML presets in ``configs/``, CLI overrides.

Every config class derives from :class:`Section` (unknown keys are errors) and documents
each field with ``Field(description=...)``. A run is configured by::

    cfg = load_config(RunConfig, "quick", ["model.name=tiny", "rl.lr=1e-5"])

(``RunConfig``, the whole run, is in :mod:`provrl.run_config`; each room defines its own
sections — ``EngineConfig``, ``EnvConfig``, ``RLConfig``, … — on top of :class:`Section`.)

``preset`` is a name in ``configs/`` (``quick`` → ``configs/quick.yaml``) or a path. An
override ``a.b.c=value`` parses ``value`` as YAML (so ``1e-5``, ``true``, ``[1, 2]`` work).
Errors name the key and where it came from (the file or the command line).

YAML is parsed with the safe loader and bounded: a config text over
:data:`MAX_CONFIG_BYTES`, or one whose anchors and aliases expand to more than
:data:`MAX_CONFIG_NODES` nodes (a "billion laughs" alias bomb: 400 bytes that expand to
10⁹ strings), is refused before anything walks the expanded tree; error messages quote at
most a few dozen characters of an offending value.
"""

from __future__ import annotations

import contextlib
import reprlib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, ClassVar, TypeVar

import yaml
from pydantic import (
    AfterValidator,
    AliasChoices,
    BaseModel,
    ConfigDict,
    ValidationError,
    model_validator,
)

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
MAX_CONFIG_BYTES = 1 << 20
"""Largest config file (or override value) read, in bytes."""
MAX_CONFIG_NODES = 100_000
"""Most YAML nodes a config may hold once its aliases are expanded."""
_SHORT = reprlib.Repr()  # bounded repr of offending values: a few items, levels, characters
_SHORT.maxlevel, _SHORT.maxlist, _SHORT.maxdict, _SHORT.maxstring = 2, 4, 4, 60


class ConfigError(ValueError):
    """A configuration file or override is invalid; the message names key and source."""


class Section(BaseModel):
    """Base of all config classes: unknown keys are errors, assignments are validated, and a
    number must be finite (``rl.lr=inf`` or ``nan`` is refused at load, naming the key: no
    config field means anything by an infinite value, and a non-finite learning rate would
    make the first update's weights NaN)."""

    model_config = ConfigDict(
        extra="forbid", validate_assignment=True, frozen=False, allow_inf_nan=False
    )

    peers_not_flat: ClassVar[tuple[str, ...]] = ()
    """Sections whose TRL names are read only under the section (``sft``: TRL's SFTConfig
    names), not as flat top-level keys (:func:`peer_keys`)."""
    peers_refused: ClassVar[dict[str, str]] = {}
    """TRL / verl names provrl has no field for, each with what to use instead: refused
    with that line, not answered "unknown key"."""

    renamed: ClassVar[dict[str, str]] = {}
    """Old key of this section → the key it is now. The old key is still read, wherever a
    config comes from (a file, ``--set``, an old run directory's ``config.yaml``); errors
    name it as it was given, and docs/config.md lists it under "Old names"."""

    @model_validator(mode="before")
    @classmethod
    def _old_keys(cls, data: Any) -> Any:
        """Old keys (:attr:`renamed`) under the names they have now."""
        return renamed_keys(cls, data, depth=0) if cls.renamed else data


def renamed_keys(
    cls: type[BaseModel],
    tree: Any,
    given: dict[str, str] | None = None,
    prefix: str = "",
    *,
    depth: int | None = None,
) -> Any:
    """``tree`` (the mapping a config class reads) with every old key (``Section.renamed``)
    under the name it has now — in sections ``depth`` levels down (None: all). ``given``
    collects the dotted key it is now → the dotted key as it was given. Both names in one
    mapping merge, unless they set the same key."""
    if not isinstance(tree, Mapping):
        return tree
    out = dict(tree)
    for old, new in getattr(cls, "renamed", {}).items():
        if old in out:
            value = out.pop(old)
            if new in out:
                both = _leaves(value) & _leaves(out[new])
                if not (isinstance(value, Mapping) and isinstance(out[new], Mapping)) or both:
                    at = f".{min(both)}" if both else ""
                    raise ConfigError(
                        f"{prefix}{old}{at} and {prefix}{new}{at}: {prefix}{old} is the old "
                        f"name of {prefix}{new}; give one of the two"
                    )
                value = deep_merge(dict(out[new]), dict(value))
            out[new] = value
            if given is not None:
                given[prefix + new] = prefix + old
    if depth == 0:
        return out
    for name, f in cls.model_fields.items():
        sub = f.annotation
        if name in out and isinstance(sub, type) and issubclass(sub, BaseModel):
            deeper = None if depth is None else depth - 1
            out[name] = renamed_keys(sub, out[name], given, f"{prefix}{name}.", depth=deeper)
    return out


def _leaves(tree: Any, prefix: str = "") -> set[str]:
    if not isinstance(tree, Mapping):
        return {prefix}
    return {
        leaf for k, v in tree.items() for leaf in _leaves(v, f"{prefix}{'.' if prefix else ''}{k}")
    }


def old_name(cls: type[BaseModel], key: str) -> str | None:
    """The dotted ``key`` under the old names of its sections (``Section.renamed``), or None
    when no part of it was renamed: ``pipeline.loop.k`` → ``pipeline.rl.k``."""
    parts, out, changed = key.split("."), [], False
    node: type[BaseModel] | None = cls
    for part in parts:
        if node is None:
            out.append(part)
            continue
        back = {new: old for old, new in getattr(node, "renamed", {}).items()}
        out.append(back.get(part, part))
        changed |= part in back
        node = _sub_section(node, part)
    return ".".join(out) if changed else None


C = TypeVar("C", bound=BaseModel)


def check_device(device: str) -> str:
    """``device`` if this machine's torch can use it, else ``ValueError`` saying why (so
    ``device=cuda`` on a CPU-only build is a config error naming the key, not an
    AssertionError deep in torch). torch is imported only for a device other than cpu."""
    if device == "cpu":
        return device
    import torch

    try:
        d = torch.device(device)
    except (RuntimeError, ValueError) as e:
        raise ValueError(f"not a torch device: {device!r} ({e})") from None
    if d.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{device!r}: this torch build or machine has no CUDA device")
        if d.index is not None and d.index >= torch.cuda.device_count():
            raise ValueError(f"{device!r}: only {torch.cuda.device_count()} CUDA device(s)")
    elif d.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"{device!r}: MPS is not available here")
    return device


TorchDevice = Annotated[str, AfterValidator(check_device)]
"""A config field holding a torch device this machine can use (:func:`check_device`)."""


def preset_path(preset: str | Path) -> Path:
    p = Path(preset)
    if p.suffix in (".yaml", ".yml") or p.exists():
        return p
    return CONFIG_DIR / f"{preset}.yaml"


def _expanded_size(node: yaml.Node, memo: dict[int, int], limit: int) -> tuple[int, Any]:
    """Nodes in the tree ``node`` stands for once aliases are expanded (an alias counts its
    whole target again), saturating just past ``limit``; also the mark of the innermost
    node that passed ``limit``. Linear in the *composed* graph: memoised by node."""
    key = id(node)
    if key in memo:
        if memo[key] < 0:  # still being counted: a recursive alias (&a [*a])
            return limit + 1, node.start_mark
        return memo[key], None
    memo[key] = -1
    size, mark = 1, None
    children: list[yaml.Node] = []
    if isinstance(node, yaml.SequenceNode):
        children = list(node.value)
    elif isinstance(node, yaml.MappingNode):
        children = [x for kv in node.value for x in kv]
    for child in children:
        n, m = _expanded_size(child, memo, limit)
        size, mark = min(size + n, limit + 1), mark or m
    if size > limit and mark is None:
        mark = node.start_mark
    memo[key] = size
    return size, mark


def parse_yaml(text: str, source: str) -> Any:
    """``yaml.safe_load(text)``, bounded in size and in alias expansion (the module
    docstring); errors are :class:`ConfigError` naming ``source`` and the line."""
    if len(text) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{source}: longer than {MAX_CONFIG_BYTES} bytes, the limit for a config")
    loader = yaml.SafeLoader(text)
    loader.name = source  # its error marks name the file, not "<unicode string>"
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        size, mark = _expanded_size(node, {}, MAX_CONFIG_NODES)
        if size > MAX_CONFIG_NODES:
            line = f" line {mark.line + 1}:" if mark is not None else ""
            raise ConfigError(
                f"{source}:{line} YAML anchors/aliases expand to more than {MAX_CONFIG_NODES} "
                "values (an alias bomb?); write the values out instead"
            )
        return loader.construct_document(node)
    except RecursionError:
        raise ConfigError(f"{source}: YAML nested too deeply") from None
    finally:
        loader.dispose()


def _set_dotted(tree: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = tree
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {key!r}: {part!r} is not a section")
        node = child
    node[parts[-1]] = value


def parse_overrides(overrides: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """``["a.b=1", "c=x"]`` → ``{"a": {"b": 1}, "c": "x"}`` (values parsed as YAML)."""
    tree: dict[str, Any] = {}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} (command line): expected key.sub=value")
        key, raw = item.split("=", 1)
        key = key.strip()
        if not key:
            raise ConfigError(f"override {item!r} (command line): empty key")
        try:
            value = parse_yaml(raw, f"override {key!r} (command line)") if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        if isinstance(value, str):  # YAML 1.1 reads "1e-5" as a string
            with contextlib.suppress(ValueError):
                value = float(value)
        _set_dotted(tree, key, value)
    return tree


def deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """``top`` over ``base``; nested mappings merge key by key, anything else replaces."""
    out = dict(base)
    for k, v in top.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def _flag_at(loc: tuple[str | int, ...], flags: Mapping[str, str]) -> tuple[str, str] | None:
    """(flag, its key) of the flag whose key is ``loc`` or holds it (an item of a list)."""
    for n in range(len(loc), 0, -1):
        key = ".".join(map(str, loc[:n]))
        if key in flags:
            return flags[key], key
    return None


class FlagError(ConfigError):
    """A command-line flag's value is invalid for the config field it sets
    (:mod:`provrl.cli.options` turns it into a usage error naming the flag)."""


def _as_given(key: str, given: Mapping[str, str]) -> str:
    """``key`` as it was given: under the old name of a renamed section it came in by."""
    for new, old in given.items():
        if key == new or key.startswith(new + "."):
            return f"{old}{key[len(new) :]}' ({old} is the old name of {new})"
    return key + "'"


def _format_errors(
    err: ValidationError,
    source: str,
    flags: Mapping[str, str] | None = None,
    given: Mapping[str, str] | None = None,
) -> str:
    flags, given = flags or {}, given or {}
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "<root>"
        quoted = "'" + _as_given(key, given)
        got = _SHORT.repr(e.get("input"))
        if not e["loc"]:  # a whole-config check (a model validator) names its keys itself
            lines.append(f"{source}: {str(e['msg']).removeprefix('Value error, ')}")
        elif e["type"] == "extra_forbidden":
            lines.append(f"{source}: unknown key {quoted}{did_you_mean(err.title, e['loc'])}")
        elif (flag := _flag_at(e["loc"], flags)) is not None:
            name, at = flag
            lines.append(f"{name}: field {at.rsplit('.', 1)[-1]!r} ({key}): {e['msg']} (got {got})")
        else:
            lines.append(f"{source}: key {quoted}: {e['msg']} (got {got})")
    return "\n".join(lines)


def load_yaml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:  # bounded read: the path may be a FIFO or /dev/zero
            raw = f.read(MAX_CONFIG_BYTES + 1)
        data = parse_yaml(raw.decode("utf-8"), str(path)) or {}
    except FileNotFoundError as e:
        known = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))
        raise ConfigError(f"{path}: no such config file (presets: {known})") from e
    except (IsADirectoryError, PermissionError) as e:
        raise ConfigError(f"{path}: cannot read the config file ({e.strerror})") from e
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start})") from e
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}{yaml_error(e)}") from e
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping, got {type(data).__name__}")
    return data


def yaml_error(e: yaml.YAMLError) -> str:
    """``:LINE: invalid YAML at column C: <problem>, <context>`` — one line number, the
    problem's (PyYAML's own text names two marks, each with the file)."""
    mark = getattr(e, "problem_mark", None)
    problem = getattr(e, "problem", None)
    if mark is None or problem is None:
        return f": invalid YAML: {' '.join(str(e).split())}"
    context = getattr(e, "context", None)
    why = f"{problem}, {context}" if context else str(problem)
    return f":{mark.line + 1}: invalid YAML at column {mark.column + 1}: {' '.join(why.split())}"


def load_config(
    cls: type[C],
    preset: str | Path | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    flags: Mapping[str, tuple[str, Any]] | None = None,
) -> C:
    """Build ``cls`` from a YAML preset, ``key.sub=value`` overrides and ``flags`` (dotted
    key → (the flag that gave it, its typed value); applied last).

    The preset is validated on its own first, so an unknown key in the file is reported
    against the file, and an unknown key in an override against the command line; a bad
    flag value raises :class:`FlagError` naming the flag and the field."""
    data: dict[str, Any] = {}
    if preset is not None:
        path = preset_path(preset)
        in_file: dict[str, str] = {}
        data = peer_keys(cls, _renamed(cls, load_yaml(path), in_file, str(path)), str(path))
        try:
            cls.model_validate(data)
        except ValidationError as e:
            raise ConfigError(_format_errors(e, str(path), given=in_file)) from None
    given: dict[str, str] = {}  # old names are resolved per source, so precedence holds
    line = _renamed(cls, parse_overrides(overrides), given, "command line")
    merged = deep_merge(data, peer_keys(cls, line, "command line"))
    names: dict[str, str] = {}
    flag_tree: dict[str, Any] = {}
    for key, (name, value) in (flags or {}).items():
        _set_dotted(flag_tree, key, value)
        names[_now(cls, key)] = name
    merged = deep_merge(merged, _renamed(cls, flag_tree, given, "command line"))
    try:
        return cls.model_validate(merged)
    except ValidationError as e:
        msg = _format_errors(e, "command line", names, given)
        at_flag = any(_flag_at(x["loc"], names) is not None for x in e.errors())
        raise (FlagError if at_flag else ConfigError)(msg) from None


def _renamed(cls: type[BaseModel], tree: Any, given: dict[str, str], source: str) -> Any:
    try:
        return renamed_keys(cls, tree, given)
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None


def _now(cls: type[BaseModel], key: str) -> str:
    """The dotted ``key`` under the names its sections have now."""
    tree: dict[str, Any] = {}
    _set_dotted(tree, key, None)
    parts = []
    node: Any = renamed_keys(cls, tree)
    while isinstance(node, dict) and node:
        part = next(iter(node))
        parts.append(part)
        node = node[part]
    return ".".join(parts)


def dump_config(cfg: BaseModel) -> str:
    """YAML text of a config (what a run writes next to its logs)."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)


# ----------------------------------------------------------------------------- peer names
def peer_names(name: str, *, trl: str | None = None, verl: str | None = None) -> dict[str, Any]:
    """``Field(...)`` arguments that make field ``name`` also accept the name TRL or verl
    give the same quantity (``verl`` as its full config path; its last part is accepted):

        clip_eps_low: float = Field(0.2, description=..., **peer_names(
            "clip_eps_low", trl="epsilon", verl="actor_rollout_ref.actor.clip_ratio_low"))

    The peers' full names are kept in the field's JSON-schema extras for docs/config.md."""
    choices = [name] + [p.rsplit(".", 1)[-1] for p in (trl, verl) if p is not None]
    return {
        "validation_alias": AliasChoices(*dict.fromkeys(choices)),
        "json_schema_extra": {k: v for k, v in (("trl", trl), ("verl", verl)) if v is not None},
    }


def accepted_keys(cls: type[BaseModel]) -> dict[str, str]:
    """Every key a config class accepts → the field it sets (names and peer aliases)."""
    out: dict[str, str] = {}
    for name, f in cls.model_fields.items():
        out[name] = name
        alias = f.validation_alias
        if isinstance(alias, AliasChoices):
            out.update({c: name for c in alias.choices if isinstance(c, str)})
        elif isinstance(alias, str):
            out[alias] = name
    return out


def _section_named(title: str) -> type[BaseModel] | None:
    stack: list[type[BaseModel]] = [Section]
    while stack:
        cls = stack.pop()
        if cls.__name__ == title:
            return cls
        stack.extend(cls.__subclasses__())
    return None


def _sub_section(cls: type[BaseModel], key: str) -> type[BaseModel] | None:
    field = cls.model_fields.get(accepted_keys(cls).get(key, key))
    ann = field.annotation if field is not None else None
    return ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None


def did_you_mean(title: str, loc: tuple[str | int, ...]) -> str:
    """`` (did you mean 'x'?)`` for an unknown key at ``loc`` of config class ``title``: the
    closest accepted key of its section, or the path of a section below it that accepts
    the key as it is (``rl.beta`` → ``rl.objective.beta``); '' when nothing is close."""
    import difflib

    cls = _section_named(title)
    for part in loc[:-1]:
        cls = _sub_section(cls, str(part)) if cls is not None else None
    if cls is None or not loc:
        return ""
    key = str(loc[-1])
    parent = ".".join(str(p) for p in loc[:-1])
    prefix = f"{parent}." if parent else ""
    accepted = accepted_keys(cls)
    if key in accepted:  # a peer name of a field that was also given under another name
        return f" (it sets {prefix + accepted[key]!r}, which is given twice)"
    for name in cls.model_fields:
        sub = _sub_section(cls, name)
        if sub is not None and key in accepted_keys(sub):
            return f" (did you mean {prefix + name + '.' + key!r}?)"
    close = difflib.get_close_matches(key, list(accepted), n=1, cutoff=0.75)
    if close:
        return f" (did you mean {prefix + close[0]!r}?)"
    flat = peer_tables(cls)[0] if not parent else {}
    close = difflib.get_close_matches(key, list(flat), n=1, cutoff=0.75)
    return f" (did you mean {close[0]!r}, TRL's name of {flat[close[0]]!r}?)" if close else ""


# ----------------------------------------------------------------------------- peer keys
def _fields(cls: type[BaseModel], prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted key, field) of every leaf field of ``cls``."""
    out: list[tuple[str, Any]] = []
    for name, f in cls.model_fields.items():
        sub = _sub_section(cls, name)
        out += _fields(sub, f"{prefix}{name}.") if sub is not None else [(prefix + name, f)]
    return out


def peer_tables(cls: type[BaseModel]) -> tuple[dict[str, str], dict[str, str]]:
    """(TRL's flat name → dotted key, verl's full path → dotted key) of every field with
    :func:`peer_names`. A TRL name is flat only outside ``cls.peers_not_flat``."""
    skip = tuple(f"{s}." for s in getattr(cls, "peers_not_flat", ()))
    trl: dict[str, str] = {}
    verl: dict[str, str] = {}
    for key, f in _fields(cls):
        extra = f.json_schema_extra if isinstance(f.json_schema_extra, dict) else {}
        if isinstance(extra.get("trl"), str) and not key.startswith(skip):
            trl.setdefault(str(extra["trl"]), key)
        if isinstance(extra.get("verl"), str):
            verl[str(extra["verl"])] = key
    return trl, verl


def peer_keys(cls: type[BaseModel], tree: Any, source: str) -> Any:
    """``tree`` (one source: a file, the command line) with the names other frameworks
    give provrl's fields under the fields' own dotted keys, so a later source overrides an
    earlier one whatever name each used (``rl.lr: 1e-4`` in a preset, ``--set
    learning_rate=1e-5`` on the command line):

    - a top-level key that is TRL's flat name of a field (``learning_rate``,
      ``num_generations``, ``max_steps``) → that field (``rl.lr``, ``pipeline.loop.k``, …);
    - a verl path (``actor_rollout_ref.actor.optim.lr``) → the field it names; an unknown
      leaf under a verl root is refused with the closest verl path provrl reads;
    - a peer alias inside a section (``rl.learning_rate``) → the field's own name;
    - a name in ``cls.peers_refused`` → refused, naming what to use instead.

    Two names of one field in one source are refused ("given twice")."""
    if not isinstance(tree, Mapping):
        return tree
    trl, verl = peer_tables(cls)
    refused: dict[str, str] = getattr(cls, "peers_refused", {})
    roots = {p.split(".", 1)[0] for p in verl} - set(cls.model_fields)
    out: dict[str, Any] = {}
    moved: dict[str, tuple[str, Any]] = {}  # dotted key → (name as given, value)
    for key, value in tree.items():
        if key in refused:
            raise ConfigError(f"{source}: {key!r} has no provrl field: {refused[key]}")
        if key in trl and key not in cls.model_fields:
            _move(moved, trl[key], key, value, source)
        elif key in roots and isinstance(value, Mapping):
            for leaf in sorted(_leaves(value)):
                path = f"{key}.{leaf}"
                if path in refused:
                    raise ConfigError(f"{source}: {path!r} has no provrl field: {refused[path]}")
                if path not in verl:
                    close = _closest(path, list(verl))
                    raise ConfigError(f"{source}: unknown verl key {path!r}{close}")
                _move(moved, verl[path], path, _get_dotted(value, leaf), source)
        else:
            out[key] = value
    out = _canonical(cls, out, source)
    for dotted, (name, value) in moved.items():
        if _has_dotted(out, dotted):
            raise ConfigError(f"{source}: {name!r} sets {dotted!r}, which is given twice")
        _set_dotted(out, dotted, value)
    return out


def _move(
    moved: dict[str, tuple[str, Any]], dotted: str, name: str, value: Any, source: str
) -> None:
    if dotted in moved:
        raise ConfigError(
            f"{source}: {moved[dotted][0]!r} and {name!r} both set {dotted!r}; give one"
        )
    moved[dotted] = (name, value)


def _closest(key: str, keys: list[str]) -> str:
    import difflib

    close = difflib.get_close_matches(key, keys, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _get_dotted(tree: Mapping[str, Any], key: str) -> Any:
    node: Any = tree
    for part in key.split("."):
        node = node[part]
    return node


def _has_dotted(tree: Mapping[str, Any], key: str) -> bool:
    node: Any = tree
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False
        node = node[part]
    return True


def _canonical(cls: type[BaseModel], tree: Any, source: str, prefix: str = "") -> Any:
    """``tree`` with every peer alias of a field (``learning_rate`` in ``rl``) under the
    field's own name, in every section."""
    if not isinstance(tree, Mapping):
        return tree
    accepted = accepted_keys(cls)
    out: dict[str, Any] = {}
    given_as: dict[str, str] = {}
    for raw, value in tree.items():
        key = str(raw)
        name: str = accepted.get(key, key)
        if name in out:
            alias = key if key != name else given_as[name]
            raise ConfigError(
                f"{source}: {prefix + alias!r} (it sets {prefix + name!r}, which is given twice)"
            )
        given_as[name] = key
        sub = _sub_section(cls, name)
        out[name] = _canonical(sub, value, source, f"{prefix}{name}.") if sub else value
    return out
