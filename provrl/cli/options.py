"""Command-line options generated from config fields: one source for name, default and help.

Every provrl command reads the same typed tree, :class:`provrl.run_config.RunConfig`::

    provrl eval --config my.yaml --set env.agent.temperature=0.7 --k 8

``--config FILE`` is a YAML preset (a name in ``configs/`` or a path), ``--set key=value``
(repeatable) overrides any key, and a command's convenience flags each *are* one config key:
the flag's type, its help (the field's ``description``) and its default (the field's) come
from the pydantic field, so nothing is typed twice. Precedence, lowest first: the field's
default, FILE, ``--set``, a flag. A command declares its flags as ``{name: key}``::

    @config_options({"k": "env.eval.k", "search_k": "env.search.k"})
    def eval_cmd(cfg: RunConfig, policy: Annotated[str, typer.Option(...)] = "oracle"): ...

and receives the validated config as ``cfg``; its other parameters stay ordinary typer
options. A bad flag value is a usage error naming the flag and the field
(``--split: field 'split' (env.eval.split): Input should be 'train', 'dev' or 'test'``).

Flag types: ``bool`` → ``--x/--no-x``; ``int``, ``float``, ``str`` as they are; a
``Literal`` or any other scalar → text that the field validates; a tuple or list →
comma-separated text, the flag repeatable (``--tiers 1,2`` = ``--tiers 1 --tiers 2``;
empty = none); ``X | None`` → ``X`` (set None with ``--set key=null``).
"""

from __future__ import annotations

import functools
import inspect
import json
import types
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin

import typer
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from provrl.config import FlagError, load_config
from provrl.run_config.run import RunConfig

F = TypeVar("F", bound=Callable[..., Any])

CONFIG_HELP = (
    "YAML preset: a name in configs/ (quick, default) or a path; unset keys keep their defaults."
)
SET_HELP = "Override any config key, e.g. --set env.agent.temperature=0.7 (repeat; YAML values)."


def field_at(root: type[BaseModel], key: str) -> FieldInfo:
    """The pydantic field of dotted ``key`` under ``root`` (a ``KeyError`` names the part
    that does not exist — raised when a command is defined, so a renamed field fails at
    import, not at use)."""
    cls: Any = root
    parts = key.split(".")
    for i, part in enumerate(parts):
        fields = getattr(cls, "model_fields", None)
        if fields is None or part not in fields:
            raise KeyError(
                f"config key {key!r}: no field {part!r} in {getattr(cls, '__name__', cls)}"
            )
        f = fields[part]
        if i == len(parts) - 1:
            return f
        cls = f.annotation
    raise KeyError(key)


def _flag_type(annotation: Any) -> tuple[Any, bool]:
    """(the click-facing type of a flag for a field of ``annotation``, whether its text is
    a comma-separated list)."""
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return _flag_type(args[0])
        return str, False
    if origin in (tuple, list, set, frozenset):
        return str, True
    if annotation in (bool, int, float, str):
        return annotation, False
    if origin is Literal or origin is Annotated:
        return str, False
    return str, False


def _show(value: Any) -> str:
    if isinstance(value, tuple | list):
        return ",".join(map(str, value)) or "(none)"
    return json.dumps(value, default=str) if isinstance(value, str) else str(value)


def flag_parameter(root: type[BaseModel], name: str, key: str) -> inspect.Parameter:
    """The typer parameter ``--name`` of config ``key``: type, help and default from the
    field."""
    from rich.markup import escape

    f = field_at(root, key)
    typ, is_list = _flag_type(f.annotation)
    opt = "--" + name.replace("_", "-")
    decls = [f"{opt}/--no-{opt[2:]}"] if typ is bool else [opt]
    default = f.get_default(call_default_factory=True)
    help_ = escape(f"{(f.description or '').rstrip()} [= --set {key}; default {_show(default)}]")
    option = typer.Option(*decls, help=help_, show_default=False)
    # a list flag may be repeated (--x a --x b) as well as comma-separated (--x a,b)
    ann = Annotated[list[str] | None, option] if is_list else Annotated[typ | None, option]
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=ann)


def _evaluated(fn: Callable[..., Any], annotation: Any) -> Any:
    """A parameter annotation as an object (``from __future__ import annotations`` leaves
    strings), evaluated in ``fn``'s module."""
    if isinstance(annotation, str):
        return eval(annotation, fn.__globals__)  # what typing.get_type_hints does
    return annotation


def _root() -> type[BaseModel]:
    return RunConfig


def config_options(
    flags: Mapping[str, str], *, root: Callable[[], type[BaseModel]] = _root
) -> Callable[[F], Callable[..., Any]]:
    """Decorate ``fn(cfg, **options)`` into a typer command that takes ``--config``,
    ``--set`` and one flag per ``flags`` entry (``name → dotted key``); see the module
    docstring. ``root`` returns the config class (default :class:`RunConfig`)."""

    def decorate(fn: F) -> Callable[..., Any]:
        cls = root()
        sig = inspect.signature(fn)
        kw = inspect.Parameter.KEYWORD_ONLY
        own = [  # fn's own options; ``cfg``'s annotation is never evaluated
            p.replace(kind=kw, annotation=_evaluated(fn, p.annotation))
            for n, p in sig.parameters.items()
            if n != "cfg"
        ]
        params = [
            *own,
            inspect.Parameter(
                "config_file",
                kw,
                default=None,
                annotation=Annotated[str | None, typer.Option("--config", help=CONFIG_HELP)],
            ),
            inspect.Parameter(
                "config_set",
                kw,
                default=None,
                annotation=Annotated[list[str] | None, typer.Option("--set", help=SET_HELP)],
            ),
            *(flag_parameter(cls, name, key) for name, key in flags.items()),
        ]
        lists = {
            name for name, key in flags.items() if _flag_type(field_at(cls, key).annotation)[1]
        }

        @functools.wraps(fn)
        def command(**kwargs: Any) -> Any:
            config_file, sets = kwargs.pop("config_file"), kwargs.pop("config_set")
            given: dict[str, tuple[str, Any]] = {}
            for name, key in flags.items():
                value = kwargs.pop(name)
                if value is None:
                    continue
                if name in lists:  # repeated and/or comma-separated
                    value = [x.strip() for v in value for x in v.split(",") if x.strip()]
                given[key] = ("--" + name.replace("_", "-"), value)
            try:
                cfg = load_config(cls, config_file, sets or [], flags=given)
            except FlagError as e:
                msg = str(e)
                flag, sep, rest = msg.partition(": ")
                if "\n" not in msg and flag.startswith("--") and sep:  # click's own wording
                    raise typer.BadParameter(rest, param_hint=f"'{flag}'") from None
                raise typer.BadParameter(msg) from None
            return fn(cfg, **kwargs)

        command.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command

    return decorate
