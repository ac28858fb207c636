"""Every private member of the OpenTelemetry API that ojs_kombu uses: the OTel seam.

Checked with opentelemetry-api 1.30.0 and 1.45.2 (:data:`CHECKED`), pinned by
``tests/test_seams.py``.  The API has no public way to ask whether a metric
instrument has an SDK behind it; ojs_kombu asks so that it buffers nothing the
API would drop.  Without the hook every measurement is buffered and handed to
the API, which drops it when no SDK is set (:data:`NO_DISCARD_CHECK`).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache, partial
from itertools import repeat
from typing import Any

from opentelemetry.metrics._internal import instrument as api_instrument

from ..spec.seams import Hook, verify

CHECKED = "1.30.0, 1.45.2"
NO_DISCARD_CHECK = ("buffering every measurement, also those the API drops while no SDK "
                    "is set")
_MISSING = object()


def _proxy_keeps_its_instrument() -> bool:
    proxy = api_instrument._ProxyHistogram("ojs_kombu.seam_probe", "", "")
    return getattr(proxy, "_real_instrument", _MISSING) is None


def _hook(owner: Any, member: str, why: str, probe: Callable[[], bool]) -> Hook:
    return Hook("OpenTelemetry API", "opentelemetry-api", owner, member, why, CHECKED,
                probe=probe, fallback=NO_DISCARD_CHECK)


HOOKS: tuple[Hook, ...] = (
    _hook(api_instrument._ProxyInstrument, "_real_instrument", "telling an instrument with "
          "no SDK behind it (events/metrics.py BufferedHistogram)", _proxy_keeps_its_instrument),
)


@cache
def fallbacks() -> frozenset[str]:
    return verify(HOOKS)


def instrument_probe(instrument: Any) -> Callable[[], Any]:
    """A call without arguments that returns the SDK instrument behind the API's proxy
    ``instrument`` (``None``: none yet), or ``instrument`` itself when it is no proxy or
    the hook is missing.  Made once per instrument: the worker asks at every moment of
    every job while no SDK is set, and this call (a ``getattr`` with its arguments
    bound, or an endless ``repeat`` of the instrument) runs no Python frame."""
    if NO_DISCARD_CHECK in fallbacks():
        return repeat(instrument).__next__
    return partial(getattr, instrument, "_real_instrument", instrument)
