"""The config codec: typed dataclasses to and from plain mappings (YAML, JSON, ``--set key=value``).

One reader, :func:`read_fields`, walks the fields of both halves; what it does with a key and a value depends on
who wrote the mapping (its ``strict`` switch):

- configs (:func:`from_dict`, :func:`to_dict`, :func:`load_config <envace.config.load_config>`): strict, since a
  person wrote the mapping: an unknown key is an error that lists the valid ones, strings from the command line are
  coerced to the field's type (``"3"``, ``"none"``, ``"a,b"``), a value of the wrong type is an error naming the
  field; nested configs are read by the same rules. Around them: :func:`config_diff`, :func:`with_defaults`,
  :func:`apply_overrides`, :func:`config_yaml`, and the ``--help`` text from each field's docstring
  (:func:`field_docs`, :func:`config_fields`, :func:`config_help`).
- data records (:class:`JSONable`, :func:`fields_to_dict`, :func:`fields_from_dict`): tasks, trajectories, rows
  and records written as JSON lines and read back by a later version: one key per field in field order, nested
  dataclasses by their own ``to_dict`` / ``from_dict``; an absent key takes the field's default and an unknown one
  is ignored.

envace.config keeps the fields of every command's config (and re-exports these names), envace.core.types the data
model.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import json
import os
import re
import textwrap
import types
import typing
from typing import Any, Callable

import yaml


# --------------------------------------------------------------------------------------------------------
# Configs
# --------------------------------------------------------------------------------------------------------


def _coerce(tp: Any, value: Any) -> Any:
    if dataclasses.is_dataclass(tp) and isinstance(value, dict):
        return from_dict(tp, value)
    origin = typing.get_origin(tp)
    if tp in (int, float, str) and isinstance(value, str):
        return tp(value)
    if tp is bool and isinstance(value, str):
        if value.lower() in ("1", "true", "yes", "on"):
            return True
        if value.lower() in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"not a boolean: {value!r}")
    if tp is str and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)  # --set model=123 is the name "123"
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if isinstance(value, str) and value.lower() in ("none", "null"):
            return None
        if len(args) == 1:
            return _coerce(args[0], value)
    if origin in (tuple, list) and isinstance(value, str):
        return tuple(x for x in value.split(",") if x) if origin is tuple else [x for x in value.split(",") if x]
    if tp is float and isinstance(value, int):
        return float(value)
    return value


def from_dict(cls: type, d: dict[str, Any]) -> Any:
    """Build a config dataclass from a dict; unknown keys are an error that lists the valid ones
    (:func:`read_fields`, strict)."""
    return read_fields(cls, d, strict=True)


def _type_ok(tp: Any, value: Any) -> bool:
    """Whether a value fits a plain field type (int, float, bool, str, optional); other types pass here."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return any(_type_ok(a, value) for a in typing.get_args(tp))
    if tp is type(None):
        return value is None
    if tp is bool:
        return isinstance(value, bool)
    if tp in (int, float):
        return isinstance(value, (int, float) if tp is float else int) and not isinstance(value, bool)
    if tp is str:
        return isinstance(value, str)
    return True


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def config_diff(
    old: dict[str, Any], new: dict[str, Any], ignore: typing.Collection[str] = ()
) -> list[tuple[str, Any, Any]]:
    """The fields in which two config dicts (:func:`to_dict`, or its JSON as saved) differ: ``(dotted name, old,
    new)``, nested configs compared field by field, values compared as JSON (a tuple equals the list it was saved
    as). A field absent on one side is ``"<absent>"`` there. ``ignore`` holds dotted names to leave out."""
    old, new = (json.loads(json.dumps(d, default=str)) for d in (old, new))
    out: list[tuple[str, Any, Any]] = []

    def walk(a: Any, b: Any, prefix: str) -> None:
        for k in sorted(set(a) | set(b), key=str):
            name = f"{prefix}{k}"
            if name in ignore:
                continue
            x, y = a.get(k, "<absent>"), b.get(k, "<absent>")
            if isinstance(x, dict) and isinstance(y, dict):
                walk(x, y, name + ".")
            elif x != y:
                out.append((name, x, y))

    walk(old, new, "")
    return out


def with_defaults(saved: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """``saved`` with the fields it lacks (nested ones too) filled from ``defaults``: a config saved before a setting
    existed is compared as if it had that setting's default (which keeps the behaviour it had)."""
    out = dict(defaults) | saved
    for k, v in defaults.items():
        if isinstance(v, dict) and isinstance(saved.get(k), dict) and v:
            out[k] = with_defaults(saved[k], v)
    return out


def describe_diff(diff: list[tuple[str, Any, Any]], limit: int = 60) -> str:
    """``name: old -> new`` for each difference, on one line (long values cut to ``limit`` characters)."""
    cut = lambda v: r if len(r := repr(v)) <= limit else r[: limit - 3] + "..."  # noqa: E731
    return "; ".join(f"{name}: {cut(a)} -> {cut(b)}" for name, a, b in diff)


def apply_overrides(d: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``key=value`` overrides (dotted keys reach nested configs; values are parsed as YAML)."""
    d = dict(d)
    for ov in overrides:
        if "=" not in ov:
            raise ValueError(f"override {ov!r} is not key=value")
        key, raw = ov.split("=", 1)
        set_dotted(d, key.strip(), _yaml(raw, f"override {ov!r}"))
    return d


def set_dotted(d: dict[str, Any], key: str, value: Any) -> None:
    """Set ``key`` of the mapping ``d`` in place; a dotted key reaches nested mappings (copied, or made)."""
    node = d
    parts = key.split(".")
    for p in parts[:-1]:
        node[p] = dict(node.get(p) or {})
        node = node[p]
    node[parts[-1]] = value


def _laid_over(base: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """``given`` laid over ``base``: nested mappings merged key by key, any other value replaced."""
    out = dict(base)
    for k, v in given.items():
        out[k] = _laid_over(base[k], v) if isinstance(v, dict) and isinstance(base.get(k), dict) else v
    return out


BASE_KEY = "base"
"""A config file's key naming another config file (relative to its own folder) that it is laid over."""


def read_config_file(path: str, _seen: tuple[str, ...] = ()) -> dict[str, Any]:
    """The mapping of a YAML config file, laid over the file its ``base:`` names (recursively; nested mappings
    merged key by key, :func:`_laid_over`), so a config that differs from another in a few fields says only those.
    A folder, a file that is not a mapping, a missing base or a cycle of bases is an error naming the file."""
    if os.path.isdir(path):
        raise ValueError(f"config file {path!r} is a folder; give a YAML file of config fields")
    real = os.path.realpath(path)
    if real in _seen:
        raise ValueError(f"{path}: its bases form a cycle ({' -> '.join(_seen + (real,))})")
    with open(path, encoding="utf-8") as f:
        d = _yaml(f.read(), path) or {}
    if not isinstance(d, dict):
        raise ValueError(f"{path}: a config file must hold a mapping")
    if BASE_KEY not in d:
        return d
    base = d.pop(BASE_KEY)
    if not isinstance(base, str) or not base:
        raise ValueError(f"{path}: {BASE_KEY}: must name a config file, got {base!r}")
    where = os.path.join(os.path.dirname(path), base)
    if not os.path.isfile(where):
        raise ValueError(f"{path}: {BASE_KEY}: {base!r} is not a file (looked for {where})")
    return _laid_over(read_config_file(where, _seen + (real,)), d)


def _yaml(text: str, where: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ValueError(f"{where}: not valid YAML ({' '.join(str(e).split())})") from None


def config_yaml(cfg: Any) -> str:
    """A config as YAML that :func:`load_config` reads back into an equal config (tuples become lists)."""
    return yaml.safe_dump(json.loads(json.dumps(to_dict(cfg), default=str)), sort_keys=False, allow_unicode=True)


def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of a dataclass (and of its dataclass bases), read from its source (Python
    keeps none at runtime); fields without one are absent."""
    docs: dict[str, str] = {}
    for base in reversed(cls.__mro__[1:]):
        if dataclasses.is_dataclass(base):
            docs |= field_docs(base)
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    for node, nxt in zip(body, body[1:]):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            docs[node.target.id] = inspect.cleandoc(nxt.value.value)
    return docs


def first_sentence(doc: str, limit: int = 300) -> str:
    """The first sentence of a docstring on one line (a period before whitespace and a capital ends it; ``e.g.``
    does not), cut to ``limit`` characters."""
    text = " ".join(doc.split("\n\n")[0].split())
    m = re.search(r"(?<!e\.g)(?<!i\.e)\.(?=\s+[A-Z`(\"])", text)
    text = text[: m.start() + 1] if m else text
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


def config_fields(cls: type, prefix: str = "", values: Any = None) -> list[tuple[str, Any, str]]:
    """(dotted name, default, first sentence of its docstring) of each field of a config dataclass; a nested
    config is listed field by field (``rollout.group_size``) with the defaults it has there (``values``)."""
    docs = field_docs(cls)
    out = []
    for f in dataclasses.fields(cls):
        if values is not None:
            default = getattr(values, f.name)
        else:
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if dataclasses.is_dataclass(default):
            out += config_fields(type(default), f"{prefix}{f.name}.", default)
        else:
            out.append((prefix + f.name, default, first_sentence(docs.get(f.name, ""))))
    return out


def config_help(cls: type, width: int = 110) -> str:
    """The ``--help`` epilog of a command configured by ``cls``: every field with its default and the first
    sentence of its docstring."""
    lines = [
        f"{cls.__name__} fields (defaults < --config F.yaml < shorthand "
        "flags < --set key=value; --print-config shows the result):"
    ]
    for name, default, doc in config_fields(cls):
        lines.append(f"  {name} = {default!r}")
        lines += textwrap.wrap(
            doc,
            width,
            initial_indent=" " * 6,
            subsequent_indent=" " * 6,
            break_long_words=False,
            break_on_hyphens=False,
        )
    return "\n".join(lines)


def check_minimums(cfg: Any, **least: int) -> None:
    """Raise ``ValueError`` naming the first field of ``cfg`` below its least value (``n=1``: at least one task)."""
    for name, low in least.items():
        value = getattr(cfg, name)
        if value < low:
            raise ValueError(f"{type(cfg).__name__}.{name}: bad value {value!r}: at least {low}")


def _replaced(obj: Any, path: str, value: Any) -> Any:
    """A copy of the dataclass ``obj`` with the (dotted) field ``path`` set to ``value``."""
    head, _, rest = path.partition(".")
    return dataclasses.replace(obj, **{head: _replaced(getattr(obj, head), rest, value) if rest else value})


# --------------------------------------------------------------------------------------------------------
# Data records
# --------------------------------------------------------------------------------------------------------


class JSONable:
    """A dataclass's ``to_dict`` / ``from_dict``, field by field (the module docstring)."""

    def to_dict(self) -> dict[str, Any]:
        return fields_to_dict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Any:
        return fields_from_dict(cls, d)


def fields_to_dict(obj: Any, leave_out: tuple[str, ...] = ()) -> dict[str, Any]:
    """``obj``'s fields (but ``leave_out``) in field order; a nested dataclass by its ``to_dict``, lists and dicts
    rebuilt around their items."""
    return {f.name: _encode(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.name not in leave_out}


def _encode(v: Any) -> Any:
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return v.to_dict()
    if isinstance(v, list):
        return [_encode(x) for x in v]
    if isinstance(v, dict):
        return {k: _encode(x) for k, x in v.items()}
    return v


def fields_from_dict(cls: type, d: dict[str, Any], **missing: Any) -> Any:
    """``cls`` from a :func:`fields_to_dict` dict (:func:`read_fields`, not strict): each field from its key, decoded
    by the field's type (a dataclass by its ``from_dict``, a list item by item, an optional one when not None); a key
    that is absent takes ``missing[name]`` if given, else the field's default (a field without one: KeyError naming
    it). Keys that are no field are ignored."""
    return read_fields(cls, d, strict=False, missing=missing)


# --------------------------------------------------------------------------------------------------------
# The reader of both
# --------------------------------------------------------------------------------------------------------


def read_fields(cls: type, d: dict[str, Any], strict: bool, missing: dict[str, Any] | None = None) -> Any:
    """The dataclass ``cls`` from the mapping ``d``, field by field over one field table (:func:`_fields`): the reader
    of configs (:func:`from_dict`, ``strict``) and of data records (:func:`fields_from_dict`). Where ``strict``, a key
    that is no field is an error that lists the valid ones, each value is coerced to its field's type
    (:func:`_coerce`: strings from the command line, nested configs read strictly) and checked (:func:`_type_ok`), an
    error naming the field, and an absent field takes its default. Else keys that are no field are ignored, each
    value is decoded by its field's type (:func:`_decoder`: a dataclass by its own ``from_dict``) and an absent field
    takes ``missing[name]`` if given, else its default (a field without one: KeyError naming it)."""
    if strict:
        fields = _fields(cls)
        if unknown := set(d) - set(fields):
            raise ValueError(f"unknown {cls.__name__} field(s) {sorted(unknown)}; valid: {sorted(fields)}")
        return cls(**{k: _config_value(cls, k, fields[k][0], v) for k, v in d.items()})
    values = {}
    for name, (decode, required) in _decoders(cls).items():
        if name in d:
            values[name] = d[name] if decode is None else decode(d[name])
        elif missing and name in missing:
            values[name] = missing[name]
        elif required:
            raise KeyError(name)
    return cls(**values)


@functools.cache
def _fields(cls: type) -> dict[str, tuple[Any, bool]]:
    """Per field of ``cls``, in field order: its type (the annotation, resolved) and whether it has no default."""
    hints = typing.get_type_hints(cls)
    no_default = (dataclasses.MISSING, dataclasses.MISSING)
    return {f.name: (hints[f.name], (f.default, f.default_factory) == no_default) for f in dataclasses.fields(cls)}


def _config_value(cls: type, name: str, tp: Any, v: Any) -> Any:
    try:
        value = _coerce(tp, v)
    except (TypeError, ValueError) as e:  # name the field: "invalid literal for int()" alone says too little
        raise ValueError(f"{cls.__name__}.{name}: bad value {v!r}: {e}") from None
    if not _type_ok(tp, value):
        raise ValueError(f"{cls.__name__}.{name}: bad value {v!r}: expected {getattr(tp, '__name__', tp)}")
    return value


@functools.cache
def _decoders(cls: type) -> dict[str, tuple[Callable[[Any], Any] | None, bool]]:
    """Per field of ``cls``, in field order: its decoder (:func:`_decoder`), made once, and whether it has no
    default."""
    return {name: (_decoder(tp), required) for name, (tp, required) in _fields(cls).items()}


def _decoder(tp: Any) -> Callable[[Any], Any] | None:
    """How a JSON value becomes a value of type ``tp``; None: as it is."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        inner = _decoder(args[0]) if len(args) == 1 else None
        return None if inner is None else (lambda v: None if v is None else inner(v))
    if origin is list:
        item = _decoder(typing.get_args(tp)[0])
        return list if item is None else (lambda v: [item(x) for x in v])
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return tp.from_dict  # type: ignore[attr-defined]
    return None
