"""pytest plugin that runs kombu's own py-amqp integration suite on ``ojs://``.

Loaded with ``-p integration.kombu_suite_plugin`` by
``integration/test_kombu_suite.py``: kombu's tests build ``pyamqp://`` URLs, so the
``pyamqp`` (and ``amqp``) schemes are pointed at the ``ojs`` transport before any
test connects.  kombu's tests stay as released.
"""

from __future__ import annotations

from kombu.transport import TRANSPORT_ALIASES

OJS_TRANSPORT = "ojs_kombu.transport:Transport"


def pytest_configure() -> None:
    TRANSPORT_ALIASES["pyamqp"] = OJS_TRANSPORT
    TRANSPORT_ALIASES["amqp"] = OJS_TRANSPORT


def pytest_report_header() -> str:
    from kombu.transport import resolve_transport

    return f"kombu transport for pyamqp://: {resolve_transport('pyamqp')}"
