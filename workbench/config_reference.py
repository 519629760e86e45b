"""Every config key described from the code itself: its type, default, allowed values and what it does.

`config_reference` walks the sections of `workbench.config.WorkbenchConfig` and returns one
`KeyReference` per field, so a key added to a dataclass appears here (and in the generated docs
page and ``python -m workbench config --explain``) with nothing else to update:

- the explanation is the field's docstring, the string literal written under it in
  ``workbench/config.py`` (`attribute_docs` reads it from the class's source with `ast`);
- the type is the field's hint in words (`workbench.config_parse.describe_type`), with the
  ``Literal`` choices listed;
- the rules are the checks `workbench.config` runs beyond the type: every ``require(ok, name,
  value, allowed)`` call in that module, in the modules of sections kept beside it
  (`VALIDATION_MODULES`: the ``grpo`` section's `workbench.config_grpo`) and in the registered
  objectives' own checks (`workbench.objective_registry.Objective.check_config`, read from each
  objective's class), attributed to the key its ``name`` spells (`validation_rules`), so a range such
  as "must be >= 1" is the message the validation itself prints. A check on a name that is no field
  (``mesh.axes``) stays with its section.

`lookup` finds one key, or raises `ConfigError` with a did-you-mean suggestion.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import inspect
import textwrap
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal, get_args, get_origin, get_type_hints

import workbench.config as config_module
import workbench.config_checks as config_checks
import workbench.config_grpo as grpo_settings
from workbench.config import WorkbenchConfig
from workbench.config_parse import ConfigError, describe_type
from workbench.objective_registry import registered_objectives

VALIDATION_MODULES = (config_module, config_checks, grpo_settings)
"""The modules whose ``require`` calls validate config keys: `workbench.config`, its cross-section checks
(`workbench.config_checks`) and the sections defined beside it; the registered objectives' classes add
their own (`objective_sources`)."""


@dataclass(frozen=True)
class KeyReference:
    """One config key, as the dataclasses and the validation define it."""

    key: str
    """The dotted key, e.g. ``train.steps`` (what an override and a YAML file's section/field set)."""
    section: str
    """The section it belongs to (``model``, ``data``, ...)."""
    type: str
    """The values the type allows, in words (``int or one of 'auto'``)."""
    default: Any
    """The default value (a fresh one for fields with a default factory)."""
    choices: tuple[Any, ...]
    """The ``Literal`` values the type allows (empty when it has none)."""
    rules: tuple[str, ...]
    """What the validation demands beyond the type, in its own words (``must be >= 1``)."""
    doc: str
    """What the key does: the docstring under the field in ``workbench/config.py``."""

    @property
    def allowed(self) -> str:
        """The type and the rules in one line: what a value must be."""
        return "; ".join((self.type, *self.rules))


def attribute_docs(cls: type) -> dict[str, str]:
    """``{name: docstring}`` of every annotated attribute of `cls` (a dataclass or a TypedDict)
    followed by a string literal in its class body, the whitespace of each folded to single spaces."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    (node,) = [n for n in tree.body if isinstance(n, ast.ClassDef)]
    docs: dict[str, str] = {}
    for stmt, following in zip(node.body, [*node.body[1:], None]):
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        value = following.value if isinstance(following, ast.Expr) else None
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            docs[stmt.target.id] = " ".join(value.value.split())
    return docs


def config_sections() -> dict[str, type]:
    """``{section name: its dataclass}`` in `WorkbenchConfig`'s order."""
    hints = get_type_hints(WorkbenchConfig)
    return {f.name: hints[f.name] for f in dataclasses.fields(WorkbenchConfig)}


def config_reference() -> list[KeyReference]:
    """Every key of `WorkbenchConfig`, section by section, in declaration order."""
    rules = validation_rules()
    out = []
    for section, cls in config_sections().items():
        docs = attribute_docs(cls)
        hints = get_type_hints(cls)
        for f in dataclasses.fields(cls):
            key = f"{section}.{f.name}"
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            out.append(
                KeyReference(
                    key=key,
                    section=section,
                    type=describe_type(hints[f.name]),
                    default=default,
                    choices=literal_choices(hints[f.name]),
                    rules=tuple(rules.get(key, ())),
                    doc=docs.get(f.name, ""),
                )
            )
    return out


def section_docs() -> dict[str, str]:
    """``{section name: what it holds}``: the docstrings of `WorkbenchConfig`'s fields."""
    return attribute_docs(WorkbenchConfig)


def literal_choices(hint: Any) -> tuple[Any, ...]:
    """The values of every ``Literal`` in `hint` (a union's included), in order."""
    if get_origin(hint) is Literal:
        return tuple(get_args(hint))
    if get_origin(hint) in (typing.Union, types.UnionType):
        return tuple(value for arg in get_args(hint) for value in literal_choices(arg))
    return ()


def lookup(key: str, reference: list[KeyReference] | None = None) -> KeyReference:
    """The `KeyReference` of the dotted `key`; an unknown key raises `ConfigError` naming it, with
    the closest key (a bare field name such as ``steps`` finds ``train.steps``; a misspelt section
    is matched first, then the field within it)."""
    reference = config_reference() if reference is None else reference
    by_key = {r.key: r for r in reference}
    if key in by_key:
        return by_key[key]
    section, _, name = key.rpartition(".")
    fields: dict[str, list[str]] = {}
    for r in reference:
        fields.setdefault(r.section, []).append(r.key.split(".", 1)[1])
    if key in fields:
        raise ConfigError(f"{key!r} is a section; explain one of its keys, e.g. {key}.{fields[key][0]}")
    if section:
        sections = difflib.get_close_matches(section, list(fields), n=1, cutoff=0.6) or list(fields)
        candidates = [f"{s}.{f}" for s in sections for f in fields[s]]
    else:
        candidates = list(by_key)
    same_name = [c for c in candidates if c.split(".", 1)[1] == name]
    names = {c.split(".", 1)[1]: c for c in reversed(candidates)}
    close = same_name or [names[n] for n in difflib.get_close_matches(name, list(names), n=1, cutoff=0.6)]
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise ConfigError(f"unknown key {key!r}{hint} (keys are section.field, sections: {', '.join(fields)})")


# ---- the validation's own rules -----------------------------------------------------------


def validation_rules() -> dict[str, list[str]]:
    """``{dotted key: [allowed, ...]}``: the message of every ``require`` call in
    `VALIDATION_MODULES`, under the key its name argument spells. A name that is no field
    (``f"{p}axes"``) is kept under ``"<section>.*"``; a call whose name cannot be read from the
    source is kept under ``"*"``, so no rule is dropped."""
    sections = {cls.__name__: name for name, cls in config_sections().items()}
    sections[WorkbenchConfig.__name__] = ""
    keys = {f"{s}.{f.name}" for s, cls in config_sections().items() for f in dataclasses.fields(cls)}
    rules: dict[str, list[str]] = {}
    functions = [node for module in VALIDATION_MODULES for node in _functions(inspect.getsource(module))]
    functions += [node for source in objective_sources() for node in _functions(source, methods=True)]
    for function in functions:
        # a helper such as `_validate_columns(obj: DataConfig, p)` checks the section its argument is
        annotated = [a.annotation for a in function.args.args if isinstance(a.annotation, ast.Name)]
        section = next((sections[a.id] for a in annotated if a.id in sections), None)
        _collect(function.body, section, {}, sections, keys, rules)
    return rules


def objective_sources() -> list[str]:
    """The source of every registered objective's class: its checks (`Objective.check_config`)."""
    return [textwrap.dedent(inspect.getsource(type(objective))) for objective in registered_objectives()]


def _functions(source: str, *, methods: bool = False) -> list[ast.FunctionDef]:
    """The functions at the top of `source` and, with `methods`, its classes' methods."""
    tree = ast.parse(source)
    found = [node for node in tree.body if isinstance(node, ast.FunctionDef)]
    if methods:
        classes = [node for node in tree.body if isinstance(node, ast.ClassDef)]
        found += [node for cls in classes for node in cls.body if isinstance(node, ast.FunctionDef)]
    return found


def _collect(
    body: list[ast.stmt],
    section: str | None,
    loops: dict[str, tuple[str, ...]],
    sections: dict[str, str],
    keys: set[str],
    rules: dict[str, list[str]],
) -> None:
    """Walk statements, tracking the ``isinstance(obj, XConfig)`` branch and ``for name in (...)`` loops."""
    for stmt in body:
        if isinstance(stmt, ast.If):
            branch = _isinstance_section(stmt.test, sections)
            _collect(stmt.body, section if branch is None else branch, loops, sections, keys, rules)
            _collect(stmt.orelse, section, loops, sections, keys, rules)
        elif isinstance(stmt, ast.For) and isinstance(stmt.target, ast.Name):
            names = _constant_strings(stmt.iter)
            inner = {**loops, stmt.target.id: names} if names is not None else loops
            _collect(stmt.body, section, inner, sections, keys, rules)
        elif isinstance(stmt, (ast.With, ast.Try)):
            _collect(stmt.body, section, loops, sections, keys, rules)
        else:
            for call in (n for n in ast.walk(stmt) if _is_require(n)):
                assert isinstance(call, ast.Call)
                _add_rule(call, section, loops, keys, rules)


def _is_require(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "require"


def _isinstance_section(test: ast.expr, sections: dict[str, str]) -> str | None:
    is_call = isinstance(test, ast.Call) and isinstance(test.func, ast.Name) and test.func.id == "isinstance"
    if is_call and len(test.args) == 2 and isinstance(test.args[1], ast.Name):
        return sections.get(test.args[1].id)
    return None


def _constant_strings(node: ast.expr) -> tuple[str, ...] | None:
    """The strings of a tuple/list literal, a module-level tuple named in it (``*WEIGHT_SHAPE_FIELDS``)
    expanded; None when it is anything else."""
    if isinstance(node, ast.Name):
        value = getattr(config_module, node.id, None)
        return tuple(value) if isinstance(value, tuple) and all(isinstance(v, str) for v in value) else None
    if not isinstance(node, (ast.Tuple, ast.List)):
        return None
    out: list[str] = []
    for element in node.elts:
        if isinstance(element, ast.Constant) and isinstance(element.value, str):
            out.append(element.value)
        elif isinstance(element, ast.Starred) and (inner := _constant_strings(element.value)) is not None:
            out.extend(inner)
        else:
            return None
    return tuple(out)


def _add_rule(
    call: ast.Call,
    section: str | None,
    loops: dict[str, tuple[str, ...]],
    keys: set[str],
    rules: dict[str, list[str]],
) -> None:
    if len(call.args) < 4:
        return
    message = _render(call.args[3])
    prefix = f"{section}." if section else ""
    names = _names(call.args[1], loops)
    if names is None:
        rules.setdefault(f"{prefix}*" if section else "*", []).append(message)
        return
    for name in names:
        key = name if "." in name or not section else f"{prefix}{name}"
        where = key if key in keys else f"{key.split('.')[0]}.*" if "." in key else "*"
        if message not in rules.get(where, []):
            rules.setdefault(where, []).append(message)


def _names(node: ast.expr, loops: dict[str, tuple[str, ...]]) -> list[str] | None:
    """The field names a ``require`` name argument spells: ``"data.max_length"``, ``f"{p}max_length"``
    (the section prefix ``p`` dropped) or ``f"{p}{name}"`` inside ``for name in (...)``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if not isinstance(node, ast.JoinedStr):
        return None
    names = [""]
    for part in node.values:
        if isinstance(part, ast.Constant):
            names = [n + str(part.value) for n in names]
        elif isinstance(part, ast.FormattedValue) and isinstance(part.value, ast.Name):
            if part.value.id in loops:
                names = [n + value for n in names for value in loops[part.value.id]]
            elif part.value.id not in ("p", "prefix"):
                return None
        else:
            return None
    return names


def _render(node: ast.expr) -> str:
    """A ``require`` message as a reader sees it without a value: ``f"must be >= batch_size={obj.batch_size}"``
    reads "must be >= batch_size"; ``{', '.join(COLUMN_KEYS)}`` reads the module's names; an optional
    part (``{... if close else ''}``) is left out; any other interpolation reads "…"."""
    if isinstance(node, ast.Constant):
        return str(node.value)
    if not isinstance(node, ast.JoinedStr):
        return ast.unparse(node)
    text = ""
    for part in node.values:
        if isinstance(part, ast.Constant):
            text += str(part.value)
        elif isinstance(part, ast.FormattedValue):
            path = ast.unparse(part.value)
            field_name = path.split(".", 1)[1] if "." in path else path
            joined = _joined_constant(part.value)
            if text.endswith(f"{field_name}=") or text.endswith(f"{field_name.split('.')[-1]}="):
                text = text[:-1]  # "hidden_size={obj.hidden_size}" -> "hidden_size"
            elif joined is not None:
                text += joined
            elif not (isinstance(part.value, ast.IfExp) and _render(part.value.orelse) == ""):
                text += "…"
    return text


def _joined_constant(node: ast.expr) -> str | None:
    """``', '.join(NAME)`` of a module-level tuple of strings, as its text; None for anything else."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "join"):
        return None
    separator = node.func.value
    names = _constant_strings(node.args[0]) if len(node.args) == 1 else None
    if isinstance(separator, ast.Constant) and isinstance(separator.value, str) and names is not None:
        return separator.value.join(names)
    return None


__all__ = [
    "KeyReference",
    "attribute_docs",
    "config_reference",
    "config_sections",
    "literal_choices",
    "lookup",
    "section_docs",
    "validation_rules",
]
