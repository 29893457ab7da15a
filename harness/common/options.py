"""Command-line options derived from pydantic models: every option is declared once, as a field.

A field of a model is an option: its type, default and validation are pydantic's, its help is the
field's ``description``. :class:`Flag` metadata in the field's ``Annotated`` says what the command
line needs beyond that: a flag spelt otherwise than ``--field-name``, a short form, old spellings that
still work with a deprecation warning, the help panel, an environment variable, and whether the
value is text for the model to parse (``10%``). Typer options (:func:`with_options`) and Locust's
argparse arguments (:func:`harness.load.options.add_arguments`) are generated from these fields, so
the flag, its type and its help cannot drift apart between commands.

A generated option defaults to ``None`` ("not given"), and the command receives only what was given,
as a nested mapping by the field's place in the model (``{"load": {"rate": "4"}}``): the model's own
default, a recipe file's value or a launcher's choice applies to the rest. The help shows the field's
default all the same.
"""

from __future__ import annotations

import copy
import functools
import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin

import typer
from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined
from typer.models import OptionInfo

from harness.common import console

_R = TypeVar("_R")
M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class Flag:
    """How a model field appears on the command line (put it in the field's ``Annotated``)."""

    names: tuple[str, ...] = ()
    """The flag's spellings, the long one first (default: ``--field-name``). A boolean that defaults to
    true is given as ``"--flush/--no-flush"``."""
    deprecated: tuple[str, ...] = ()
    """Old spellings that still work, hidden from the help, with one warning naming the new one
    (:class:`Renamed`; a plain typer option's: :func:`old_spellings`)."""
    panel: str | None = None
    """The help panel (``--help`` groups options by panel)."""
    envvar: str | None = None
    """An environment variable the option is read from when the flag is not given."""
    text: bool = False
    """Taken as text whatever the field's type: the model parses it (``10%`` for a fraction)."""
    metavar: str | None = None
    hidden: bool = False
    uses: tuple[str, ...] = ()
    """Which commands show the option, as the kinds of use its model names (the load options':
    :data:`harness.load.options.USES`); a command takes the fields of the uses it has."""


def flag_of(info: FieldInfo) -> Flag:
    """The field's :class:`Flag` (the default one when it has none)."""
    return next((m for m in info.metadata if isinstance(m, Flag)), Flag())


def flag_names(name: str, info: FieldInfo) -> tuple[str, ...]:
    """The option strings of field ``name``: its :class:`Flag`'s, else ``--field-name``."""
    return flag_of(info).names or (f"--{name.replace('_', '-')}",)


def long_flag(name: str, info: FieldInfo) -> str:
    """The field's main flag (``--out``), for messages: ``--on/--off`` gives ``--on``."""
    return flag_names(name, info)[0].split("/", 1)[0]


def description(info: FieldInfo) -> str:
    """The field's help: its ``description``, which every field that is an option must have."""
    if not info.description:
        raise TypeError(f"an option field needs a description: {info}")
    return info.description


def default_text(info: FieldInfo) -> str | None:
    """The field's default as the help shows it (``None``: no default to show)."""
    value = info.get_default(call_default_factory=True)
    if value is PydanticUndefined or value is None or value in ([], ()):
        return None
    if isinstance(value, bool):
        return None  # a switch: the flag's presence says it
    return str(value)


@dataclass(frozen=True)
class Option:
    """One command-line option: a field of a model, and where its value goes."""

    name: str
    """The command function's parameter (the field's name; unique within a command)."""
    path: tuple[str, ...]
    """Where a given value goes in the nested mapping the command receives (``("load", "rate")``)."""
    info: FieldInfo

    @property
    def flag(self) -> Flag:
        return flag_of(self.info)

    @property
    def long(self) -> str:
        return long_flag(self.name, self.info)


def options_of(
    model: type[BaseModel],
    *,
    at: Sequence[str] = (),
    only: Iterable[str] | None = None,
    exclude: Iterable[str] = (),
) -> list[Option]:
    """The options of ``model``'s fields (``only`` these, in that order; else all but ``exclude``),
    their values placed under ``at`` in the mapping a command receives."""
    fields = model.model_fields
    names = list(only) if only is not None else [n for n in fields if n not in set(exclude)]
    unknown = [n for n in names if n not in fields]
    if unknown:
        raise KeyError(f"{model.__name__} has no field {unknown}")
    return [Option(n, (*at, n), fields[n]) for n in names]


def flagged(model: type[BaseModel], *, at: Sequence[str] = ()) -> list[Option]:
    """The options of ``model``'s fields that carry a :class:`Flag` (in field order): a settings model
    whose flags are marked on its fields, not listed beside it (``harness serve``)."""
    return options_of(model, at=at, only=[n for n, f in model.model_fields.items() if _has_flag(f)])


def _has_flag(info: FieldInfo) -> bool:
    return any(isinstance(m, Flag) for m in info.metadata)


def _typer_type(opt: Option) -> Any:
    """The type typer parses the option as (always optional: ``None`` is "not given")."""
    ann = opt.info.annotation
    if opt.flag.text or get_origin(ann) is Literal:
        return str | None  # the model parses and checks it: one error message for every command
    union = get_origin(ann) in (UnionType, Union)
    args = [a for a in get_args(ann) if a is not type(None)] if union else [ann]
    base = args[0] if len(args) == 1 else None
    if base is bool:
        return bool | None
    if get_origin(base) is list:
        (item,) = get_args(base)
        return list[str] | None if item in (str, SecretStr) else list[item] | None  # type: ignore[valid-type]
    if base is SecretStr:
        return str | None
    for plain in (Path, float, int, str):
        if base is plain:
            return plain | None
    return str | None  # a value type the model parses from text (a share "50%", a rate)


def _parameter(
    opt: Option, panel: str | None, required: bool, default: Any = None, *, needed: bool = False
) -> inspect.Parameter:
    """``required``: typer checks it; ``needed``: the command does (an option with old spellings,
    any of which will do). Either way its help shows no default: there is none."""
    flag = opt.flag
    text = description(opt.info)
    shown = str(default) if default is not None else default_text(opt.info)
    option = typer.Option(
        *flag_names(opt.name, opt.info),
        help=text + ("" if text.endswith(".") else ".") + (" Required." if needed and not required else ""),
        rich_help_panel=flag.panel or panel,
        show_default=shown if shown is not None and not (required or needed) else False,
        envvar=flag.envvar,
        show_envvar=flag.envvar is not None,
        metavar=flag.metavar,
        hidden=flag.hidden,
    )
    kind = inspect.Parameter.KEYWORD_ONLY
    typ = _typer_type(opt)
    if required:
        base = get_args(typ)[0]
        return inspect.Parameter(opt.name, kind, annotation=Annotated[base, option])
    return inspect.Parameter(opt.name, kind, annotation=Annotated[typ, option], default=None)


def warn_deprecated(old: str, new: str) -> None:
    """The one deprecation warning, on stderr: ``harness: warning: OLD is deprecated; use NEW``."""
    console.err().print(
        f"harness: warning: {old} is deprecated; use {new}", markup=False, highlight=False, soft_wrap=True
    )


def _unset(value: Any) -> bool:
    """``None`` or an empty list: an option not given."""
    return value is None or value in ([], ())


def _optional(typ: Any) -> Any:
    """``typ | None`` (``typ`` itself where it takes ``None`` already)."""
    if get_origin(typ) in (UnionType, Union) and type(None) in get_args(typ):
        return typ
    return typ | None


def _typer_option(param: inspect.Parameter) -> tuple[Any, OptionInfo]:
    """The type and the typer option of a parameter declared ``Annotated[TYPE, typer.Option(...)]``."""
    ann = param.annotation
    if get_origin(ann) is Annotated:
        typ, *meta = get_args(ann)
        for m in meta:
            if isinstance(m, OptionInfo):
                return typ, m
    raise TypeError(
        f"{param.name}: an option with old spellings is declared Annotated[TYPE, typer.Option(...)]"
    )


def _long_of(name: str, info: OptionInfo) -> str:
    """The main flag of parameter ``name``'s typer option (``Option("--out", "-o")`` gives ``--out``).
    In ``Annotated``, typer reads the option's first positional argument, its ``default``, as a flag."""
    first = (info.default,) if isinstance(info.default, str) else ()
    decls: list[str] = [*first, *(info.param_decls or ())]
    longs = [d.split("/", 1)[0] for d in decls if d.startswith("--")]
    return longs[0] if longs else (decls or [f"--{name.replace('_', '-')}"])[0]


@dataclass(frozen=True)
class Renamed:
    """An option renamed from its ``old`` spellings to ``new``: the one way the command line keeps an
    old spelling working (:class:`Flag` ``deprecated=`` on a model field, :func:`old_spellings` on a
    plain typer option). Each old spelling is a hidden option of its own beside the new one, with the
    same type and checks; :meth:`take` turns what was given into the new option's value, with one
    warning naming the spelling used (:func:`warn_deprecated`). Two spellings at once is an error."""

    name: str
    """The command function's parameter of the new option."""
    new: str
    old: tuple[str, ...]
    default: Any = None
    """The value when no spelling is given."""
    required: bool = False
    """One of the spellings must be given (typer cannot say so: either will do)."""

    def hidden_name(self, old: str) -> str:
        """The command function's parameter of the old spelling ``old``."""
        return f"deprecated__{self.name}__{old.lstrip('-').replace('-', '_')}"

    def hidden(self, param: inspect.Parameter) -> list[inspect.Parameter]:
        """The hidden parameters of the old spellings of ``param`` (the new option's parameter)."""
        typ, info = _typer_option(param)
        out = []
        for old in self.old:
            option = copy.copy(info)
            option.default = ...  # in Annotated, typer would take a default here for the first flag
            option.param_decls = (old,)
            option.hidden = True
            option.help = f"Deprecated: use {self.new}."
            option.show_default = False
            option.envvar = None  # the variable fills the new option, not this one too
            option.rich_help_panel = None
            kind = inspect.Parameter.KEYWORD_ONLY
            out.append(
                inspect.Parameter(
                    self.hidden_name(old), kind, annotation=Annotated[_optional(typ), option], default=None
                )
            )
        return out

    def take(self, values: dict[str, Any]) -> None:
        """Resolve the spellings among a command's parsed ``values`` (by parameter): the old ones'
        parameters are removed and the new one's holds the value given under any spelling."""
        used = [(old, v) for old in self.old if not _unset(v := values.pop(self.hidden_name(old), None))]
        value = values.get(self.name)
        if used:
            if not _unset(value) or len(used) > 1:
                raise typer.BadParameter(
                    f"{used[0][0]} is the old spelling of {self.new}: give one", param_hint=self.new
                )
            old, value = used[0]
            warn_deprecated(old, self.new)
        elif _unset(value):
            if self.required:
                raise typer.BadParameter(f"Missing option '{self.new}'.", param_hint=self.new)
            value = self.default
        values[self.name] = value


def _replace_signature(
    command: Callable[..., Any], sig: inspect.Signature, params: list[inspect.Parameter]
) -> None:
    command.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params}
    del command.__wrapped__  # type: ignore[attr-defined]  # typer reads the signature, not the function's own


def old_spellings(**renames: str | tuple[str, ...]) -> Callable[[Callable[..., _R]], Callable[..., _R]]:
    """Keep the old spellings of a command's plain typer options working: ``@old_spellings(out="--output")``
    (parameter → its old spelling, or a tuple of them), under ``@app.command``. Each old spelling is a
    hidden option beside the new one (:class:`Renamed`): the command receives its value as the new
    option's, after one warning; both at once is an error. (A field's option: ``Flag(deprecated=…)``.)
    """

    def decorate(func: Callable[..., _R]) -> Callable[..., _R]:
        sig = inspect.signature(func, eval_str=True)
        params = dict(sig.parameters)
        table: list[Renamed] = []
        hidden: list[inspect.Parameter] = []
        for name, old in renames.items():
            assert name in params, f"{func.__name__} has no parameter {name}"
            param = params[name]
            typ, info = _typer_option(param)
            assert typ is not bool, f"{func.__name__}: an old spelling of a switch is not supported"
            required = param.default is inspect.Parameter.empty
            default = None if required else param.default
            renamed = Renamed(
                name,
                _long_of(name, info),
                (old,) if isinstance(old, str) else old,
                default,
                required,
            )
            # The new option defaults to None ("not given", beside an old spelling); its help still
            # shows the default the command applies.
            option = copy.copy(info)
            if default is not None and info.show_default is True:
                option.show_default = str(default)
            params[name] = param.replace(annotation=Annotated[_optional(typ), option], default=None)
            hidden += renamed.hidden(param)
            table.append(renamed)

        @functools.wraps(func)
        def command(**kwargs: Any) -> _R:
            for renamed in table:
                renamed.take(kwargs)
            return func(**kwargs)

        _replace_signature(command, sig, [*params.values(), *hidden])
        return command

    return decorate


def place(given: dict[str, Any], path: Sequence[str], value: Any) -> None:
    """Put ``value`` at ``path`` in a nested mapping (creating the levels on the way)."""
    node = given
    for part in path[:-1]:
        node = node.setdefault(part, {})
    node[path[-1]] = value


def with_options(
    options: Sequence[Option],
    *,
    panel: str | None = None,
    required: Iterable[str] = (),
    defaults: Mapping[str, Any] | None = None,
    param: str = "given",
) -> Callable[[Callable[..., _R]], Callable[..., _R]]:
    """Give a typer command the ``options`` (one flag each, typed and helped from its field) and hand
    it, as the keyword ``param``, a nested mapping of the options given on the command line or by
    their environment variable (``{"load": {"rate": "4"}}``). An option given by an old spelling
    (``Flag(deprecated=…)``) counts as given, after a warning; two spellings at once is an error.

    ``required``: options (by name) the command cannot run without (typer then says so);
    ``defaults``: the default the help shows where the command applies its own (by name).
    """
    opts = list(options)
    names = [o.name for o in opts]
    dupes = {n for n in names if names.count(n) > 1}
    assert not dupes, f"two options share a name: {dupes}"
    must = set(required)
    own_default = dict(defaults or {})
    # A required option with an old spelling is checked by its Renamed, not by typer (either will do).
    renames = _renames(opts, required=must)
    generated = [
        _parameter(o, panel, o.name in must - renames.keys(), own_default.get(o.name), needed=o.name in must)
        for o in opts
    ]
    generated += [
        h
        for o, p in zip(opts, list(generated), strict=True)
        if o.name in renames
        for h in renames[o.name].hidden(p)
    ]

    def decorate(func: Callable[..., _R]) -> Callable[..., _R]:
        sig = inspect.signature(func, eval_str=True)
        assert param in sig.parameters, f"{func.__name__} takes the options as `{param}`"
        own = [p for p in sig.parameters.values() if p.name != param]
        clash = {p.name for p in own} & {p.name for p in generated}
        assert not clash, f"{func.__name__} declares generated options itself: {clash}"

        @functools.wraps(func)
        def command(**kwargs: Any) -> _R:
            given = _take_given(kwargs, opts, renames)
            return func(**kwargs, **{param: given})

        _replace_signature(command, sig, [*own, *generated])
        return command

    return decorate


def _renames(opts: Sequence[Option], *, required: Iterable[str] = ()) -> dict[str, Renamed]:
    """The options among ``opts`` whose field has old spellings (``Flag(deprecated=…)``), by name."""
    must = set(required)
    return {
        o.name: Renamed(o.name, o.long, o.flag.deprecated, required=o.name in must)
        for o in opts
        if o.flag.deprecated
    }


def _take_given(
    values: dict[str, Any], opts: Sequence[Option], renames: Mapping[str, Renamed]
) -> dict[str, Any]:
    """Remove the ``opts``' parameters (an old spelling's too) from ``values`` and return the options
    given as a nested mapping (old spellings resolved, with their warning)."""
    given: dict[str, Any] = {}
    for o in opts:
        if o.name in renames:
            renames[o.name].take(values)
        value = values.pop(o.name, None)
        if not _unset(value):
            place(given, o.path, value)
    return given


def options_given(params: Mapping[str, Any], options: Sequence[Option]) -> dict[str, Any]:
    """The options given among a parsed command line's ``params`` (a click context's, of a command
    made by :func:`with_options`), as the nested mapping the command would receive."""
    opts = list(options)
    return _take_given(dict(params), opts, _renames(opts))


def flag_for(options: Sequence[Option], path: Sequence[str]) -> str | None:
    """The flag of the option at ``path`` (``None``: no option puts a value there)."""
    return next((o.long for o in options if o.path == tuple(path)), None)


def validated(
    model: type[M], given: Mapping[str, Any], options: Sequence[Option], *, at: Sequence[str] = ()
) -> M:
    """``model`` from the options ``given`` (its fields' values, placed under ``at`` among ``options``);
    a bad value is a ``ConfigError`` naming the flag that gave it (an item of a list by its position)."""
    from pydantic import ValidationError

    from harness.common.errors import ConfigError

    try:
        return model.model_validate(dict(given))
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = err.get("loc", ())
        msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
        if len(loc) > 1 and isinstance(loc[1], int):
            msg = f"value {loc[1] + 1}: {msg}"
        flag = flag_for(options, (*at, str(loc[0]))) if loc else None
        raise ConfigError(msg, field=flag or (".".join(map(str, loc)) or model.__name__)) from None


def merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``over`` on top, mappings merged level by level (a recipe file, then flags)."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def parse_command_line(func: Callable[..., Any], args: Sequence[str], *, prog: str, field: str) -> Any:
    """Parse ``args`` as the typer command ``func`` would (without running it); the click context,
    whose ``params`` hold every parameter's value. A mistake (an unknown option, a bad value) is a
    ``ConfigError`` naming ``field``: the option that carried the arguments (``--serve-args``)."""
    from harness.common.errors import ConfigError

    app = typer.Typer()
    app.command()(func)
    command = typer.main.get_command(app)
    try:
        return command.make_context(prog, list(args))
    except Exception as exc:  # typer's vendored click errors, by their shared interface
        fmt = getattr(exc, "format_message", None)
        if fmt is None:
            raise
        raise ConfigError(f"{prog} {' '.join(args)}: {fmt()}", field=field) from None
