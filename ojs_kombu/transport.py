"""The documented dotted path of the transport: ``ojs_kombu.transport:Transport``.

``broker_transport="ojs_kombu.transport:Transport"`` names the same class as an
``ojs://`` broker URL; the transport itself lives in :mod:`ojs_kombu.amqp.transport`.
"""

from __future__ import annotations

from .amqp.transport import SSLTransport, Transport, register_transport

__all__ = ["SSLTransport", "Transport", "register_transport"]
