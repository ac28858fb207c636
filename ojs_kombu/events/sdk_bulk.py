"""Buffered histogram values handed to the OpenTelemetry SDK's aggregations in bulk.

The SDK's ``Histogram.record`` spends about 5 µs on every value: it builds a
``Measurement`` (cleaning the attributes), asks the exemplar filter, finds
the views, copies and hashes the attributes again, then aggregates.  A worker
records two values per job, so that was the largest single cost of metrics
in a drain.  :func:`bulk_recorder` does the same work once per flush and
label set, then hands each value to the very aggregation objects the SDK's
own path would reach (``aggregate``, the SDK's own bucket, sum, min and max
arithmetic).  The result read by any reader is what ``record`` gives: the
unit tests compare both on the installed SDK.

This reaches into the SDK's private classes, so it is used only where they
look exactly as expected (checked when a flush resolves them, before anything
is counted); anything else, and every value whose context could get an
exemplar, goes through the public ``record``.
"""

from __future__ import annotations

import inspect
import math
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

#: ``(amount, attributes, context)`` as :class:`~ojs_kombu.events.metrics.BufferedHistogram`
#: buffers them.
Entry = tuple[float, "Mapping[str, Any] | None", Any]
#: Hands a batch to the SDK; returns the entries left for the public ``record``.
Recorder = Callable[[list[Entry]], list[Entry]]


class Unsupported(Exception):
    """The SDK's private classes are not as expected: nothing was counted."""


class _Value:
    """What an SDK aggregation reads of a measurement it is not asked to sample."""

    __slots__ = ("value",)

    def __init__(self, value: float) -> None:
        self.value = value


def bulk_recorder(histogram: Any) -> Recorder | None:
    """A bulk recorder for ``histogram`` (an SDK histogram, possibly behind the API's
    proxy), or ``None`` when its SDK is not the one this was written against."""
    real = getattr(histogram, "_real_instrument", histogram)
    sdk = sys.modules.get("opentelemetry.sdk.metrics._internal.instrument")
    if sdk is None or not isinstance(real, getattr(sdk, "Histogram", ())):
        return None
    try:
        from opentelemetry.sdk.metrics._internal._view_instrument_match import (
            _hash_attributes,
        )
        from opentelemetry.sdk.metrics._internal.aggregation import _Aggregation
        from opentelemetry.sdk.metrics._internal.exemplar.exemplar_filter import (
            AlwaysOffExemplarFilter,
            TraceBasedExemplarFilter,
        )
        from opentelemetry.trace import get_current_span

        consumer = real._measurement_consumer
        config = consumer._sdk_config
        consumer._reader_storages.values  # noqa: B018  (present, a dict)
        real._is_enabled  # noqa: B018
        if "should_sample_exemplar" not in inspect.signature(_Aggregation.aggregate).parameters:
            return None
    except (ImportError, AttributeError, TypeError, ValueError):
        return None

    def resolve(attributes: Mapping[str, Any] | None) -> list[tuple[Any, Any]]:
        """``(view match, aggregation)`` of every reader and view for one label set, as
        ``_ViewInstrumentMatch.consume_measurement`` finds them (raises if the SDK differs)."""
        found = []
        for storage in list(consumer._reader_storages.values()):
            for match in storage._get_or_init_view_instrument_match(real):
                keys = match._view._attribute_keys
                attrs = dict(attributes) if attributes else {}
                if keys is not None:
                    attrs = {k: v for k, v in attrs.items() if k in keys}
                key = _hash_attributes(attrs)
                if match._reset_on_collect:  # delta: aggregate under the match's lock
                    found.append((match, (key, attrs)))
                    continue
                aggregation = match._attributes_aggregation.get(key)
                if aggregation is None:
                    with match._lock:
                        aggregation = match._get_or_create_aggregation(key, attrs)
                aggregation.aggregate  # noqa: B018
                found.append((None, aggregation))
        return found

    def plan(entries: list[Entry]) -> tuple[list[Entry], list[tuple[list[Any], list[float]]]]:
        """The entries for ``record``, and the aggregations with the values for each."""
        if not real._is_enabled():
            return entries, []
        exemplar_filter = config.exemplar_filter
        if isinstance(exemplar_filter, AlwaysOffExemplarFilter):
            sampled: Callable[[Any], bool] = _never
        elif type(exemplar_filter) is TraceBasedExemplarFilter:
            seen: dict[int, bool] = {}

            def sampled(context: Any) -> bool:
                answer = seen.get(id(context))
                if answer is None:
                    answer = seen[id(context)] = bool(
                        get_current_span(context).get_span_context().trace_flags.sampled)
                return answer
        else:
            return entries, []
        rest: list[Entry] = []
        groups: dict[tuple[Any, ...], tuple[Mapping[str, Any] | None, list[float]]] = {}
        for entry in entries:
            amount, attributes, context = entry
            if sampled(context) or not (math.isfinite(amount) and amount >= 0):
                rest.append(entry)  # an exemplar, or a value record() warns about
                continue
            group_key = tuple(attributes.items()) if attributes else ()
            group = groups.get(group_key)
            if group is None:
                if not all(key and type(key) is str and type(value) in _PLAIN
                           for key, value in group_key):
                    rest.append(entry)  # labels the SDK would clean first
                    continue
                group = groups[group_key] = (attributes, [])
            group[1].append(amount)
        return rest, [(resolve(attributes), values) for attributes, values in groups.values()]

    def record(entries: list[Entry]) -> list[Entry]:
        try:
            rest, targets = plan(entries)
        except Exception as exc:
            raise Unsupported(repr(exc)) from exc
        for found, values in targets:  # nothing counted before every lookup succeeded
            for match, aggregation in found:
                if match is None:
                    _aggregate(aggregation, values)
                    continue
                key, attrs = aggregation
                with match._lock:
                    _aggregate(match._get_or_create_aggregation(key, attrs), values)
        return rest

    return record


#: Attribute value types the SDK's cleaning leaves as they are.
_PLAIN = frozenset({str, bool, int, float})


def _never(_context: Any) -> bool:
    return False


def _aggregate(aggregation: Any, values: Iterable[float]) -> None:
    aggregate = aggregation.aggregate
    for value in values:
        aggregate(_Value(value), False)
