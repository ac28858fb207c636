"""Celery's JSON as the envelope encoder reads and writes it.

kombu's JSON body of a task message is read back with its tagged values
(``register_type``) and its NaN and infinities as Python values, which then
travel in their natural JSON forms (:mod:`ojs_kombu.spec.typed_values`); the
envelope is written compact, refusing what JSON cannot carry so that the
typed path takes it.
"""

from __future__ import annotations

import json
import math
from typing import Any

from .errors import NonJSONArgumentError
from .typed_values import registered_decoder


class _NotNative(TypeError):
    """A value the fast encoder leaves to :func:`~ojs_kombu.spec.typed_values.natural`."""


def _json_value(obj: Any) -> Any:
    """What kombu's JSON encoder writes for ``obj`` when it is JSON (a ``__json__``
    reducer, as Celery's signatures have); anything else takes the typed path."""
    reducer = getattr(obj, "__json__", None)
    if reducer is not None:
        return reducer()
    raise _NotNative


def _kombu_value(obj: dict[str, Any]) -> Any:
    """A tagged object of a body kombu serialised, read back as its Python value (it
    then travels in its natural JSON form, typed in ``meta``)."""
    if "__type__" in obj and "__value__" in obj and len(obj) == 2:
        tag = obj["__type__"]
        read = registered_decoder(tag) if isinstance(tag, str) else None
        if read is None:
            raise NonJSONArgumentError(
                f"a task argument is kombu's tagged type {tag!r}, which no type registered "
                "with kombu.utils.json.register_type reads")
        return read(obj["__value__"])
    return obj


def _constant(name: str) -> float:
    # kombu's JSON writes NaN and the infinities; they travel as typed strings
    return {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}[name]


_DECODER = json.JSONDecoder(parse_constant=_constant)
_TAGGED_DECODER = json.JSONDecoder(object_hook=_kombu_value, parse_constant=_constant)
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False,
                            default=_json_value)


def dumps_envelope(value: Any) -> bytes:
    """``value`` as compact JSON (a ``__json__`` reducer is called); a value JSON
    cannot carry raises ``TypeError`` or ``ValueError``, for the typed path."""
    return _ENCODER.encode(value).encode()


def read_celery_json(body: bytes | str) -> Any:
    """A body kombu's JSON serialised, with its tagged values read back.

    kombu tags non-JSON values as ``{"__type__": ..., "__value__": ...}``; only a
    body that mentions the tag takes the (slower) per-object check.
    """
    text = body.decode() if isinstance(body, bytes) else body
    return (_TAGGED_DECODER if '"__type__"' in text else _DECODER).decode(text)
