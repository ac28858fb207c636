"""Python values JSON has no type for, in the natural JSON form every language reads.

Celery's JSON (kombu 5.3+) carries ``datetime``, ``date``, ``time``, ``UUID``,
``Decimal`` and ``bytes`` as tagged objects (``{"__type__": ..., "__value__": ...}``)
that only kombu reads back.  An OJS job carries them in ``args`` (and in
``x_celery``: kwargs, canvas, headers) as what another language reads without
help: an ISO 8601 string, a UUID string, a decimal string, base64; ``NaN`` and
the infinities as the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``.  What
gives a Celery task its Python types back travels beside the values, in one
place: the envelope's ``meta.x_celery_types``, an object mapping a JSON Pointer
(RFC 6901) into the envelope (``/args/0``, ``/x_celery/kwargs/order/id``) to a
type name (:data:`BUILTIN_TYPES`, or the marker of a type the app registered
with ``kombu.utils.json.register_type``).  A client in another language ignores
it, or writes it to send a Celery task a ``date``.

Pure code: kombu's registry reaches it through :func:`use_registered_types`,
called by the AMQP floor's kombu seam.
"""

from __future__ import annotations

import base64
import copy
import functools
import math
import re
from collections.abc import Callable, Mapping
from datetime import date, datetime, time
from decimal import Decimal
from typing import Any
from uuid import UUID

from .errors import JobRejected, Picklable
from .x_celery import EMBED_KEYS, X_CELERY

#: The ``meta`` key of the type map.
TYPES_KEY = "x_celery_types"
#: The envelope members whose values a type map may point into.
TYPED_ROOTS = ("args", X_CELERY)

Path = tuple[str | int, ...]


def _float(text: str) -> float:
    value = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}.get(text)
    if value is None:
        raise ValueError(f"{text!r} is not 'NaN', 'Infinity' or '-Infinity'")
    return value


def _float_text(value: float) -> str:
    return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")


def _bytes(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"), validate=True)


#: Type name -> (Python type, to natural JSON, from natural JSON).  ``datetime``
#: before ``date``: a datetime is a date too.  The names are kombu's markers.
BUILTIN_TYPES: dict[str, tuple[type, Callable[[Any], Any], Callable[[Any], Any]]] = {
    "datetime": (datetime, datetime.isoformat, datetime.fromisoformat),
    "date": (date, date.isoformat, date.fromisoformat),
    "time": (time, time.isoformat, time.fromisoformat),
    "uuid": (UUID, str, UUID),
    "decimal": (Decimal, str, Decimal),
    "bytes": (bytes, lambda b: base64.b64encode(b).decode("ascii"), _bytes),
    "float": (float, _float_text, _float),
}


class _Registry:
    """Types the app registered with kombu (``register_type``), as the kombu seam
    reads them: ``encode(value)`` gives ``(marker, JSON value)`` or ``None``;
    ``decoder(marker)`` the function that reads it back, or ``None``."""

    encode: Callable[[Any], tuple[str | None, Any] | None] = staticmethod(lambda value: None)
    decoder: Callable[[str], Callable[[Any], Any] | None] = staticmethod(lambda marker: None)
    #: Whether the app registered a built-in type (``Decimal``) with an encoder of its own.
    overrides: Callable[[type], bool] = staticmethod(lambda kind: False)
    #: What turns a value to text the way kombu's encoder does (Django's lazy strings).
    textual: tuple[type, ...] = ()


_registry = _Registry()


def use_registered_types(encode: Callable[[Any], tuple[str | None, Any] | None],
                         decoder: Callable[[str], Callable[[Any], Any] | None],
                         textual: tuple[type, ...] = (),
                         overrides: Callable[[type], bool] = lambda kind: False) -> None:
    """Let values of types an app registered with kombu travel (the kombu seam calls it)."""
    _registry.encode = encode
    _registry.decoder = decoder
    _registry.textual = textual
    _registry.overrides = overrides


def registered_decoder(marker: str) -> Callable[[Any], Any] | None:
    """What reads back a value kombu tagged ``marker`` (``None``: no such type)."""
    return _registry.decoder(marker)


class UnencodableValue(Picklable, TypeError):
    """A value no JSON form and no registered type carries, at ``path``."""

    def __init__(self, path: Path, value: Any, advice: str) -> None:
        self.path = path
        self.value = value
        self.advice = advice
        super().__init__(f"{type(value).__name__} at {python_path(path)}: {advice}")


@functools.lru_cache(maxsize=4096)  # the same few paths, job after job
def pointer(path: Path) -> str:
    """The RFC 6901 JSON Pointer of ``path``."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in path)


def parse_pointer(text: str) -> list[str]:
    if not text.startswith("/"):
        raise ValueError(f"{text!r} is not a JSON Pointer (it must start with '/')")
    return [part.replace("~1", "/").replace("~0", "~") for part in text[1:].split("/")]


def python_path(path: Path) -> str:
    """How a path into the envelope reads in an error, as the caller wrote the value:
    ``args[1]``, ``kwargs['order']['id']``, ``chain[0]['args'][0]``, ``headers['x']``."""
    if path[:1] == ("args",):
        name, rest = "args", path[1:]
    elif path[:2] == (X_CELERY, "kwargs"):
        name, rest = "kwargs", path[2:]
    elif path[:1] == (X_CELERY,) and len(path) > 1 and path[1] in EMBED_KEYS:
        name, rest = str(path[1]), path[2:]
    elif path[:1] == (X_CELERY,):
        name, rest = "headers", path[1:]
    elif path[:1] == ("meta",):
        name, rest = "ojs_meta", path[1:]
    else:
        name, rest = "value", path
    return name + "".join(f"[{p!r}]" for p in rest)


def _advice(value: Any) -> str:
    if isinstance(value, set | frozenset):
        return "JSON has no sets: pass a list (sorted(...) keeps it stable)"
    if isinstance(value, bytearray | memoryview):
        return "pass bytes(...) (sent as base64)"
    if isinstance(value, complex):
        return "JSON has no complex numbers: pass [real, imag]"
    return ("JSON cannot carry it: pass its fields as a dict, or register the type with "
            "kombu.utils.json.register_type")


def _key(key: Any, path: Path) -> str:
    """A mapping key as JSON writes it (as Python's json module does)."""
    if isinstance(key, str):
        return key
    if key is True or key is False or key is None:
        return "true" if key is True else ("false" if key is False else "null")
    if isinstance(key, int):
        return str(int(key))
    if isinstance(key, float):  # as json writes a float key
        return repr(key) if math.isfinite(key) else _float_text(key)
    raise UnencodableValue((*path, str(key)), key,
                           f"a mapping key must be a string or a number, not "
                           f"{type(key).__name__}")


#: What JSON writes as it is.
_PLAIN = frozenset({str, int, bool, type(None)})
#: Exact built-in types -> (type name, to natural JSON): one lookup for the common case.
_EXACT = {python_type: (name, to_json)
          for name, (python_type, to_json, _) in BUILTIN_TYPES.items() if name != "float"}


def natural(value: Any, path: Path, types: dict[str, str]) -> Any:
    """``value`` with every typed value in its natural JSON form, each recorded in
    ``types`` by its pointer; :class:`UnencodableValue` for what JSON cannot carry.

    Runs only for a job whose values the plain JSON encoder refused, once per job;
    plain values are passed through without a call."""
    kind = type(value)
    if kind in _PLAIN:
        return value
    exact = _EXACT.get(kind)
    if exact is not None and not _registry.overrides(kind):
        types[pointer(path)] = exact[0]
        return exact[1](value)
    if kind is list or kind is tuple:
        return [item if type(item) in _PLAIN else natural(item, (*path, i), types)
                for i, item in enumerate(value)]
    if kind is dict or isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            k = key if type(key) is str else _key(key, path)
            out[k] = item if type(item) in _PLAIN else natural(item, (*path, k), types)
        return out
    if kind is float:
        if math.isfinite(value):
            return value
        types[pointer(path)] = "float"
        return _float_text(value)
    if isinstance(value, list | tuple):
        return [natural(item, (*path, i), types) for i, item in enumerate(value)]
    if isinstance(value, str | int):  # str and int subclasses (enums) as JSON writes them
        return value
    if isinstance(value, float):
        return natural(float(value), path, types)
    reducer = getattr(value, "__json__", None)
    if reducer is not None:
        return natural(reducer(), path, types)
    if _registry.textual and isinstance(value, _registry.textual):
        return str(value)
    registered = _registry.encode(value)
    if registered is not None:
        marker, encoded = registered
        inner = natural(encoded, path, types)
        if marker is not None:
            types[pointer(path)] = marker
        return inner
    for name, (python_type, to_json, _) in BUILTIN_TYPES.items():
        if isinstance(value, python_type):
            types[pointer(path)] = name
            return to_json(value)
    raise UnencodableValue(path, value, _advice(value))


class TypeMapError(ValueError):
    """A consumed job's type map cannot be applied: the message names the entry."""


#: ``ojs_max_type_map_entries``' default: far more typed values than a call carries.
DEFAULT_MAX_TYPE_MAP_ENTRIES = 10_000
#: ``x-ojs-error-code`` of a job whose type map is over its bounds (:func:`check_type_map_size`).
TYPE_MAP_TOO_LARGE = "TYPE_MAP_TOO_LARGE"


def check_type_map_size(types: Any, members: Mapping[str, Any], limit: int) -> None:
    """Refuse a type map larger than ``limit`` entries, or than the values of
    ``members`` (``args``, ``x_celery``) it could type, before any entry is read: what
    each entry costs (a parsed pointer, a copied container) stays proportional to the
    job's own values and under a bound the worker sets.  Raises
    :class:`~ojs_kombu.spec.errors.JobRejected` with ``TYPE_MAP_TOO_LARGE``."""
    if not isinstance(types, dict):
        return  # check_type_map names the problem
    size = len(types)
    if size > limit:
        raise JobRejected(
            TYPE_MAP_TOO_LARGE,
            f"meta.{TYPES_KEY} has {size} entries, more than this worker reads "
            f"(ojs_max_type_map_entries={limit})")
    if size and _values_fewer_than(size, [members[name] for name in TYPED_ROOTS
                                          if name in members]):
        raise JobRejected(
            TYPE_MAP_TOO_LARGE,
            f"meta.{TYPES_KEY} has {size} entries, more than the values of "
            f"{' and '.join(TYPED_ROOTS)} (one entry types one value)")


def _values_fewer_than(count: int, roots: list[Any]) -> bool:
    """Whether the JSON values inside ``roots`` (nested containers counted: a registered
    type may read back from an object or an array) are fewer than ``count``; stops
    counting once there are enough."""
    stack: list[Any] = []
    for root in roots:
        stack.extend(_children(root))
    seen = 0
    while stack:
        seen += 1
        if seen >= count:
            return False
        stack.extend(_children(stack.pop()))
    return True


def _children(value: Any) -> Any:
    if isinstance(value, dict):
        return value.values()
    return value if isinstance(value, list) else ()


#: A list index in a pointer (RFC 6901: no sign, no leading zero, ASCII digits).
_INDEX = re.compile(r"0|[1-9][0-9]*")


def check_type_map(types: Any, allowed: Callable[[list[str]], bool] = lambda parts: True
                   ) -> dict[str, list[str]]:
    """The pointers of a consumed job's type map (``meta.x_celery_types``), parsed, or
    :class:`TypeMapError`: the map is an object of pointer -> type name, every type is
    one this worker reads, and ``allowed`` accepts every pointer (what may be retyped:
    never a field Celery reads, or a whole container)."""
    if not isinstance(types, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in types.items()):
        raise TypeMapError(f"meta.{TYPES_KEY} must be an object of JSON Pointer -> type name "
                           "strings")
    parsed: dict[str, list[str]] = {}
    for ptr, name in types.items():
        if name not in BUILTIN_TYPES and _registry.decoder(name) is None:
            raise TypeMapError(
                f"meta.{TYPES_KEY}[{ptr!r}] names type {name!r}, which this worker cannot read "
                f"(known: {', '.join(BUILTIN_TYPES)}, and types the app registers with "
                "kombu.utils.json.register_type)")
        try:
            parts = parse_pointer(ptr)
        except ValueError as exc:
            raise TypeMapError(f"meta.{TYPES_KEY}[{ptr!r}]: {exc}") from None
        if parts[0] not in TYPED_ROOTS or not allowed(parts):
            raise TypeMapError(
                f"meta.{TYPES_KEY}[{ptr!r}] may not be retyped: a type map points at an "
                "argument, a keyword argument, a custom header or a canvas signature's "
                "args, kwargs or options (or inside them)")
        parsed[ptr] = parts
    return parsed


def restore(members: dict[str, Any], types: Mapping[str, str],
            parsed: Mapping[str, list[str]] | None = None) -> dict[str, Any]:
    """The envelope ``members`` (``args``, ``x_celery``) with each value ``types`` points
    to read back as its Python type; deepest pointers first, so a registered type whose
    JSON holds typed values gets them as Python values.  Containers on a pointer's way
    are copied, nothing else (``members`` stay as they were).  :class:`TypeMapError`
    names a pointer that leads nowhere or a value that does not read as its type,
    whatever the decoder raised."""
    restored = {name: members[name] for name in TYPED_ROOTS if name in members}
    copies: set[int] = set()  # ids of the containers copied here (safe to change)

    def own(parent: Any, key: Any) -> Any:
        child = parent[key]
        if isinstance(child, list | dict) and id(child) not in copies:
            child = parent[key] = copy.copy(child)
            copies.add(id(child))
        return child

    for ptr in sorted(types, key=lambda p: -p.count("/")):
        name = types[ptr]
        try:
            parts = parsed[ptr] if parsed is not None else parse_pointer(ptr)
            parent: Any = restored
            for part in parts[:-1]:
                parent = own(parent, _step(parent, part))
            last = _step(parent, parts[-1])
            raw = parent[last]
        except (KeyError, IndexError, TypeError, ValueError):
            raise TypeMapError(f"meta.{TYPES_KEY}[{ptr!r}] points at no value of "
                               f"{' or '.join(TYPED_ROOTS)}") from None
        builtin = BUILTIN_TYPES.get(name)
        read = builtin[2] if builtin is not None else _registry.decoder(name)
        try:
            if read is None:
                raise ValueError("no decoder")
            if builtin is not None and not isinstance(raw, str):
                raise TypeError(f"a {name} is a string in JSON, not {type(raw).__name__}")
            parent[last] = read(raw)
        except Exception as exc:  # an app's decoder may raise anything: the job is refused
            raise TypeMapError(f"meta.{TYPES_KEY}[{ptr!r}]: {_short(raw)} does not read as "
                               f"{name} ({type(exc).__name__}: {exc})") from None
    return restored


def _step(parent: Any, part: str) -> str | int:
    """The key of ``part`` in ``parent``: a list index must be one (RFC 6901)."""
    if isinstance(parent, list):
        if _INDEX.fullmatch(part) is None:
            raise ValueError(part)
        return int(part)
    if not isinstance(parent, dict):
        raise TypeError(part)
    return part


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
