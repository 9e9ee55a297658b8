"""A setting declared once, as an attrs field with its default, bounds and help text; its
command-line flag and its ``IZH_*`` environment variable are derived from that field.

The flag is ``--`` and the field's name in kebab case, the variable ``IZH_`` and the name in
capitals, unless the field's ``setting(flag=..., env=...)`` says otherwise. The field's type
says how a value is read: ``bool`` is a switch (``1/true/yes/on`` in the environment), a
``tuple[...]`` takes several values (space-separated after its flag, or repeated with
``action="append"``; comma-separated in the environment), ``X | None`` is read as ``X``.
"""

from __future__ import annotations

import argparse
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeAlias

import attrs
from attrs import validators as v

#: A setting's field; settings hold values of every type (quoted: attrs' class is generic
#: only to type checkers).
Field: TypeAlias = "attrs.Attribute[Any]"

ENV_PREFIX = "IZH_"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def setting(default: Any, help: str, *, choices: Sequence[str] | None = None,
            validator: Any = None, converter: Callable[[Any], Any] | None = None,
            parse: Callable[[str], Any] | None = None, flag: str | None = None,
            env: str | None = None, action: str | None = None,
            metavar: str | None = None) -> Any:
    """An attrs field the CLI and the environment can set. ``choices``: the only values (checked
    here and listed by ``--help``); ``parse``: text (one item, for a tuple) to value, else the
    converter or the annotated type; ``action="append"``: a tuple field's flag is repeated."""
    validators = list(validator) if isinstance(validator, list) else [validator]
    if choices is not None:
        validators.append(v.in_(tuple(choices)))
    validators = [one for one in validators if one is not None]
    metadata = {"help": help, "choices": choices, "parse": parse, "flag": flag, "env": env,
                "action": action, "metavar": metavar}
    return attrs.field(default=default, validator=validators or None, converter=converter,
                       metadata=metadata)


def flag_name(field: Field) -> str:
    return field.metadata.get("flag") or "--" + field.name.replace("_", "-")


def env_name(field: Field) -> str:
    return field.metadata.get("env") or ENV_PREFIX + field.name.upper()


def settable_fields(cls: type) -> tuple[Field, ...]:
    """Every field of ``cls``, its annotations resolved; each must come from ``setting``."""
    fields: tuple[Field, ...] = attrs.fields(attrs.resolve_types(cls))
    for field in fields:
        if "help" not in field.metadata:
            raise TypeError(f"{cls.__name__}.{field.name} is not declared with setting()")
    return fields


def _shape(tp: Any) -> tuple[Any, bool]:
    """The type one value is read as, and whether the field holds a tuple of them."""
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        tp = next(t for t in typing.get_args(tp) if t is not type(None))
    if typing.get_origin(tp) is tuple:
        return typing.get_args(tp)[0], True
    return tp, False


def _parser_of(field: Field) -> Callable[[str], Any]:
    base, many = _shape(field.type)
    parse: Callable[[str], Any] | None = field.metadata["parse"]
    converter = field.converter  # a plain one-argument callable, not an attrs.Converter
    if parse is None and not many and converter is not None \
            and not isinstance(converter, attrs.Converter):
        parse = converter
    return parse or base


def add_flags(parser: argparse.ArgumentParser, cls: type) -> None:
    """One flag per setting of ``cls``; a flag not given leaves its field at the default."""
    for field in settable_fields(cls):
        meta = field.metadata
        options: dict[str, Any] = {"dest": field.name, "default": argparse.SUPPRESS,
                                   "help": _help(field)}
        base, many = _shape(field.type)
        if base is bool:
            options["action"] = "store_true"
        else:
            options["type"] = _argparse_type(_parser_of(field), custom=meta["parse"] is not None)
            if meta["choices"] is not None:
                options["choices"] = meta["choices"]
            if many and meta["action"]:
                options["action"] = meta["action"]
            elif many:
                options["nargs"] = "+"
            if meta["metavar"] or base in _METAVARS:
                options["metavar"] = meta["metavar"] or _METAVARS[base]
        parser.add_argument(flag_name(field), **options)


def given_flags(cls: type, args: argparse.Namespace) -> dict[str, Any]:
    """The settings of ``cls`` that ``args`` (from ``add_flags``' flags) carries."""
    names = {f.name for f in settable_fields(cls)}
    return {name: value for name, value in vars(args).items() if name in names}


def given_env(cls: type, env: Mapping[str, str]) -> dict[str, Any]:
    """The settings of ``cls`` set (non-empty) in ``env``; ``ValueError`` names a bad one."""
    values = {}
    for field in settable_fields(cls):
        name = env_name(field)
        raw = env.get(name)
        if raw in (None, ""):
            continue
        try:
            values[field.name] = _from_env_text(field, raw)
        except ValueError as exc:
            raise ValueError(f"{name}={raw!r}: {exc}") from None
    return values


def _from_env_text(field: Field, raw: str) -> Any:
    base, many = _shape(field.type)
    if many:
        parse = _parser_of(field)
        return tuple(parse(item.strip()) for item in raw.split(",") if item.strip())
    if base is bool:
        if raw.lower() not in _TRUE + _FALSE:
            raise ValueError(f"not a boolean (one of {', '.join(_TRUE + _FALSE)})")
        return raw.lower() in _TRUE
    return _parser_of(field)(raw)


def _argparse_type(parse: Callable[[str], Any], custom: bool) -> Callable[[str], Any]:
    """A custom parser's ``ValueError`` as argparse's usage error with its own message; the
    built-in types keep argparse's (``invalid int value: 'x'``)."""
    if not custom:
        return parse

    def read(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return read


#: What ``--help`` shows for a value of each type (else the field's name in capitals).
_METAVARS = {int: "N", float: "X", Path: "PATH"}


def _help(field: Field) -> str:
    """The field's help, with its default unless that says nothing or the help tells it."""
    text: str = field.metadata["help"]
    if not (field.default is None or field.default is False or field.default == ()
            or "default" in text):
        text = (text[:-1] + f"; default: {field.default})" if text.endswith(")")
                else text + f" (default: {field.default})")
    return text.replace("%", "%%")  # argparse formats help strings with %
