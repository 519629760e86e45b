"""Typed dataclass configs from plain data: building sections, dotted overrides, string coercion.

Generic over any tree of dataclasses whose fields carry type hints (`workbench.config` holds the
workbench's own). What it does, and nothing about the workbench's fields:

- `build_section`: a dict (from YAML or ``to_dict``) into a dataclass, section by section, each
  value checked against its hint, each unknown key answered with a did-you-mean suggestion, and a
  caller's ``validate`` hook run on every section built;
- `split_override` / `set_dotted`: ``section.field=value`` strings (a CLI flag, a papermill
  parameter) set into that dict;
- `parse_string` / `check_value`: a string coerced to a field's type with explicit parsers (bool
  words, ints, floats, a YAML flow mapping for ``dict[str, str]``, ``a,b`` or ``[a, b]`` for
  ``list[T]``), never ``eval``; a value that fits none of the hint's options raises `ConfigError`
  naming the field, the value and the types allowed (`describe_type`);
- `yaml_problem`: a YAML syntax error as one line naming the file, line and column.

The hints understood: ``bool``, ``int``, ``float``, ``str``, ``None``, ``Literal[...]``,
``list[T]``, ``dict[str, str]`` and unions of them.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, get_args, get_origin, get_type_hints

import yaml


class ConfigError(ValueError):
    """A config value or key is not allowed; the message says which and why."""


_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}


def split_override(text: str) -> tuple[str, str]:
    """``"train.steps=10"`` -> ``("train.steps", "10")``; the value is everything after the first '='."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like section.field=value (e.g. train.steps=10)")
    key, value = text.split("=", 1)
    return key.strip(), value.strip()


def _field_names(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def _unknown_key(key: str, cls: type, prefix: str) -> ConfigError:
    names = _field_names(cls)
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
    hint = f"; did you mean {prefix + close[0]!r}?" if close else ""
    where = f"section {prefix.rstrip('.')!r}" if prefix else "the top level"
    return ConfigError(f"unknown key {prefix + key!r} in {where}{hint} (allowed: {', '.join(names)})")


def set_dotted(data: dict[str, Any], cls: type, dotted: str, value: Any) -> None:
    """Set ``data[section][field] = value`` for ``dotted = "section.field"`` of the dataclass `cls`.

    A string value is parsed into the field's type (`parse_string`); any other value is kept and
    checked when the config is built.
    """
    parts = dotted.split(".")
    node, node_cls, prefix = data, cls, ""
    for i, part in enumerate(parts):
        if part not in _field_names(node_cls):
            raise _unknown_key(part, node_cls, prefix)
        hint = get_type_hints(node_cls)[part]
        if i == len(parts) - 1:
            if dataclasses.is_dataclass(hint):
                raise ConfigError(
                    f"{prefix + part!r} is a section; set one of its fields, e.g. {prefix}{part}.{_field_names(hint)[0]}=..."
                )
            node[part] = parse_string(value, hint, f"{prefix}{part}") if isinstance(value, str) else value
        else:
            if not dataclasses.is_dataclass(hint):
                raise ConfigError(f"{prefix + part!r} is a value, not a section; cannot set {dotted!r}")
            node, node_cls, prefix = node[part], hint, f"{prefix}{part}."


def build_section(cls: type, data: Any, prefix: str, validate: Callable[[Any, str], None]) -> Any:
    """The dataclass `cls` from the mapping `data`, nested sections included.

    Every value is checked against its field's hint (`check_value`), then ``validate(obj, prefix)``
    runs on each section built, innermost first. A class may name, in ``LEGACY_VALUES``, values a
    field accepted in older configs beyond its hint: they pass untouched, for the class's
    ``__post_init__`` to map onto the fields that replaced them.
    """
    where = prefix.rstrip(".") or "config"
    if not isinstance(data, dict):
        raise ConfigError(f"{where} must be a mapping, got {data!r}")
    hints = get_type_hints(cls)
    for key in data:
        if key not in _field_names(cls):  # a ClassVar has a hint but is no field
            raise _unknown_key(str(key), cls, prefix)
    legacy: dict[str, tuple[Any, ...]] = getattr(cls, "LEGACY_VALUES", {})
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            continue
        hint, value, name = hints[f.name], data[f.name], f"{prefix}{f.name}"
        if dataclasses.is_dataclass(hint):
            kwargs[f.name] = build_section(hint, value or {}, f"{name}.", validate)
        elif isinstance(value, str) and value in legacy.get(f.name, ()):
            kwargs[f.name] = value
        else:
            kwargs[f.name] = check_value(value, hint, name)
    obj = cls(**kwargs)
    validate(obj, prefix)  # its range checks name the allowed range of a non-finite value they meet
    refuse_non_finite(obj, prefix)
    return obj


def parse_string(text: str, hint: Any, name: str) -> Any:
    """Turn a CLI/papermill string into the field's type (no eval).

    Tried in the hint's order: null words for an optional field, bool words, int, float; a
    ``dict[str, str]`` field reads the string as a YAML flow mapping (``{prompt: question}``,
    every scalar kept as a string); a ``list[T]`` field (without ``str`` beside it) reads ``a,b`` or
    ``[a, b]``, each element as a ``T`` field would; ``str`` and ``Literal`` fields keep the text (a Literal is
    checked when the config is built).
    """
    options = _options(hint)
    if text.lower() in {"none", "null", "~"} and type(None) in options:
        return None
    for option in options:
        if option is bool and text.lower() in _TRUE | _FALSE:
            return text.lower() in _TRUE
        if option is int:
            try:
                return int(text)
            except ValueError:
                pass
        if option is float:
            try:
                return float(text)
            except ValueError:
                pass
        if get_origin(option) is dict and text.lstrip().startswith("{"):
            return _flow_mapping(text, hint, name)
        if get_origin(option) is list and str not in options:
            return _comma_list(text, get_args(option)[0], hint, name)
    if str in options or any(get_origin(o) is Literal for o in options):
        return text
    return check_value(text, hint, name)  # raises with the allowed types


def _flow_mapping(text: str, hint: Any, name: str) -> dict[str, Any]:
    # BaseLoader builds only str, list and dict (no tags, no type guessing): a column named
    # 'yes' or '2024' stays that string, and nothing in the text can construct an object.
    try:
        value = yaml.load(text, Loader=yaml.BaseLoader)
    except yaml.YAMLError as err:
        problem = " ".join(str(err).split())
        raise ConfigError(
            f"{name}={text!r} is not allowed: not a YAML flow mapping ({problem}); "
            "write it like {prompt: question, response: answer}"
        ) from None
    return check_value(value, hint, name)


def _comma_list(text: str, item: Any, hint: Any, name: str) -> Any:
    """``"a,b"`` or ``"[a, b]"`` as a list of `item` (each element parsed as such a field would be)."""
    inner = text.strip().removeprefix("[").removesuffix("]")
    items = [part.strip().strip("'\"") for part in inner.split(",") if part.strip()]
    return check_value([parse_string(part, item, name) for part in items], hint, name)


def _options(hint: Any) -> list[Any]:
    origin = get_origin(hint)
    if origin is typing.Union or origin is types.UnionType:
        out = []
        for arg in get_args(hint):
            out.extend(_options(arg))
        return out
    return [hint]


def describe_type(hint: Any) -> str:
    """The values a hint allows, in words: ``one of 'a', 'b' or null``, ``a list of str``, ..."""
    parts = []
    for option in _options(hint):
        if get_origin(option) is Literal:
            parts.append("one of " + ", ".join(repr(a) for a in get_args(option)))
        elif option is type(None):
            parts.append("null")
        elif get_origin(option) is list:
            parts.append(f"a list of {get_args(option)[0].__name__}")
        elif get_origin(option) is dict:
            key, item = get_args(option)
            parts.append(f"a mapping of {key.__name__} to {item.__name__} (e.g. {{prompt: question}})")
        else:
            parts.append(getattr(option, "__name__", str(option)))
    return " or ".join(parts)


def check_value(value: Any, hint: Any, name: str) -> Any:
    """`value` as the field's type (an int widened to float); else `ConfigError` with the types allowed."""
    for option in _options(hint):
        if option is type(None) and value is None:
            return None
        if get_origin(option) is Literal and value in get_args(option) and isinstance(value, str):
            return value
        on_off = get_origin(option) is Literal and {"on", "off"} <= set(get_args(option))
        if on_off and isinstance(value, bool):  # YAML 1.1 reads a bare on/off (yes/no, true/false) as a bool
            return "on" if value else "off"
        if option is bool and isinstance(value, bool):
            return value
        if option is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        if option is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if option is str and isinstance(value, str):
            return value
        list_of = get_args(option)[0] if get_origin(option) is list else None
        if list_of is float and isinstance(value, list) and all(_is_number(v) for v in value):
            return [float(v) for v in value]  # YAML's [1, 0.5]: an int widened, as a float field's
        if list_of is not None and isinstance(value, list) and all(isinstance(v, list_of) for v in value):
            return list(value)
        if get_origin(option) is dict and isinstance(value, dict):
            key_type, item_type = get_args(option)
            if all(isinstance(k, key_type) and isinstance(v, item_type) for k, v in value.items()):
                return dict(value)
    quoted = quoted_value_problem(value, name, hint)
    problem = f"{quoted}; expected" if quoted else "expected"
    raise ConfigError(f"{name}={value!r} is not allowed: {problem} {describe_type(hint)}")


def quoted_value_problem(value: Any, name: str, hint: Any = None) -> str | None:
    """What to say of a string that is a quoted number (``'"5"'`` from a shell, ``"5"`` in YAML), bool or
    choice of `hint` ('it is a quoted string, not a number: drop the quotes (train.steps=5)');
    None for any other value."""
    if not isinstance(value, str):
        return None
    text = value.strip()
    quoted = len(text) >= 2 and text[0] == text[-1] and text[0] in "'\""
    inner = text[1:-1].strip() if quoted else text
    try:
        number = float(inner)
        kind = "a number"
        if not math.isfinite(number):  # without quotes it is refused all the same
            return None
        if not quoted and not _bare_number_fits(inner, hint):
            # not quoted by the user: YAML 1.1 reads 1e-4 as text, or the number is not of the field's type
            return _yaml_text_number(inner, number, hint)
    except ValueError:
        choices = [a for o in _options(hint) if get_origin(o) is Literal for a in get_args(o)]
        if not quoted or not inner:
            return None
        if inner.lower() in _TRUE | _FALSE and bool in _options(hint):
            kind = "true/false"
        elif inner in choices:
            kind = f"the choice {inner}"
        else:
            return None
    return f"it is a quoted string, not {kind}: drop the quotes ({name}={inner})"


def _bare_number_fits(inner: str, hint: Any) -> bool:
    """Whether the unquoted text `inner` can only have been a quoted number: YAML reads it bare as a number
    the field takes (an override's own parser reads such text as that number before it gets here). With
    no `hint` (a range check's message), only an integer is sure to be one."""
    bare = yaml.safe_load(inner)
    if isinstance(bare, bool) or not isinstance(bare, (int, float)):
        return False
    if hint is None:
        return isinstance(bare, int)
    try:
        check_value(bare, hint, "")
    except ConfigError:
        return False
    return True


def _yaml_text_number(inner: str, number: float, hint: Any) -> str | None:
    """A float field's value that YAML 1.1 reads as text (``1e-4``: no dot, no exponent sign): how to
    write it so YAML reads a number; None for anything else."""
    if float not in _options(hint) or not isinstance(yaml.safe_load(inner), str):
        return None
    mantissa, _, exponent = repr(number).partition("e")
    written = mantissa + ("" if "." in mantissa else ".0") + (f"e{exponent}" if exponent else "")
    return (
        f"YAML reads {inner} as text, not a number (a number there has a dot, and a sign on any exponent): "
        f"write {written}"
    )


def require(ok: bool, name: str, value: Any, allowed: str) -> None:
    """Raise ``ConfigError("{name}={value!r} is not allowed: {allowed}")`` unless `ok`; a value that is
    not a finite number (inf, nan: YAML's ``.inf``, an override's ``inf`` or ``1e999``) is refused
    whatever `ok` says (``inf > 0`` holds), with the range `allowed` named."""
    if not ok or not _finite(value):
        problem = "" if _finite(value) else "not a finite number; "
        quoted = quoted_value_problem(value, name) if not ok else None
        problem = f"{quoted}; it " if quoted else problem
        raise ConfigError(f"{name}={value!r} is not allowed: {problem}{allowed}")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _finite(value: Any) -> bool:
    return not isinstance(value, float) or math.isfinite(value)


def refuse_non_finite(obj: Any, prefix: str) -> None:
    """`ConfigError` for the first float field of the section `obj` that is not finite: the backstop for
    fields the validate hook's range checks (`require`) do not name."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if not _finite(value):
            raise ConfigError(
                f"{prefix}{f.name}={value!r} is not allowed: not a finite number; give a finite one"
            )


def yaml_problem(err: yaml.YAMLError, path: Path | None) -> str:
    """'config file 'run.yaml' is not valid YAML: line 3, column 4: expected ',' or ']', but got ':' (...)'."""
    mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    problem = getattr(err, "problem", None) or str(err)
    context = getattr(err, "context", None)
    what = f"config file {str(path)!r}" if path is not None else "config text"
    detail = f" ({context})" if context else ""
    return (
        f"{what} is not valid YAML: {where}{problem}{detail}; fix that line (a value with ':' or '#' in it "
        "needs quotes; indent with spaces)"
    )
