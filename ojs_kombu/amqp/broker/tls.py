"""TLS to the broker: the host name checked by default, and failures retrying cannot mend.

**What is verified.**  py-amqp checks the broker's certificate against a host
name only when ``server_hostname`` is among its TLS options; with a CA and
``cert_reqs=CERT_REQUIRED`` alone it verifies the chain, so any certificate
from the same CA (another broker's, any service's) is accepted for any host,
and the password goes to whoever holds one.  :func:`verified_options` fills
in what Celery's ``broker_use_ssl`` leaves out: ``server_hostname`` is the
host of the URL being connected to (an IP address is checked against the
certificate's IP addresses; kombu connects to ``127.0.0.1`` for ``localhost``,
so that is the name checked for it), ``cert_reqs`` is ``CERT_REQUIRED``, and
py-amqp's ``context`` form gets ``check_hostname=True``.  An explicit
``server_hostname`` wins (a broker reached through a name its certificate does
not hold).  The only way to turn the checks off is to say so:
``cert_reqs=ssl.CERT_NONE`` (or ``check_hostname: False`` in ``context``),
logged as a warning, since then the password goes to anyone on the path.

**What is permanent.**  :func:`permanent_failure` tells a handshake that will
fail the same way on every retry (the broker's certificate fails verification,
the broker sent a TLS alert refusing the client's certificate, the port does
not speak TLS, the client's own certificate files are unusable) from a broker
that is merely down (refused, reset, timed out), from the exception's type,
its OpenSSL reason code and its verification code, never its text.  Such a
failure is a :class:`~ojs_kombu.spec.errors.BrokerTLSError`, which kombu and
Celery do not retry.
"""

from __future__ import annotations

import logging
import os
import socket
import ssl
from typing import Any

from amqp.transport import SSLTransport

from ...spec.errors import BrokerCertificateError, BrokerTLSError, OJSConfigurationError
from ..wire.py_amqp_seam import write_failure_hook

logger = logging.getLogger(__name__)

#: OpenSSL's verification codes (``X509_V_ERR_*``) of a broker certificate, by kind.
VERIFY_KINDS = {
    9: ("server_certificate_not_yet_valid", "the broker's certificate is not valid yet"),
    10: ("server_certificate_expired", "the broker's certificate has expired"),
    62: ("hostname_mismatch", "the broker's certificate does not hold the host name"),
    64: ("hostname_mismatch", "the broker's certificate does not hold the IP address"),
}
UNTRUSTED = ("server_certificate_untrusted",
             "the broker's certificate is not signed by a CA of ca_certs")

#: OpenSSL reason codes of a TLS alert or handshake error that no retry mends.
ALERT_KINDS = {
    "TLSV13_ALERT_CERTIFICATE_REQUIRED": (
        "client_certificate_required",
        "the broker requires a client certificate (set certfile and keyfile)"),
    "TLSV1_ALERT_UNKNOWN_CA": (
        "client_certificate_rejected",
        "the broker does not trust the CA that signed the client certificate"),
    "SSLV3_ALERT_BAD_CERTIFICATE": (
        "client_certificate_rejected", "the broker refused the client certificate"),
    "SSLV3_ALERT_CERTIFICATE_UNKNOWN": (
        "client_certificate_rejected", "the broker refused the client certificate"),
    "SSLV3_ALERT_UNSUPPORTED_CERTIFICATE": (
        "client_certificate_rejected", "the broker refused the client certificate"),
    "TLSV1_ALERT_ACCESS_DENIED": (
        "client_certificate_rejected", "the broker denied access to the client certificate"),
    "SSLV3_ALERT_CERTIFICATE_REVOKED": (
        "client_certificate_rejected", "the broker says the client certificate is revoked"),
    "SSLV3_ALERT_CERTIFICATE_EXPIRED": (
        "client_certificate_expired", "the broker says the client certificate has expired"),
    "SSLV3_ALERT_HANDSHAKE_FAILURE": (
        "handshake_refused", "the broker refused the handshake (TLS 1.2: no client "
        "certificate, or no protocol version or cipher in common)"),
    "TLSV1_ALERT_PROTOCOL_VERSION": (
        "handshake_refused", "no TLS version in common with the broker"),
    "UNSUPPORTED_PROTOCOL": ("handshake_refused", "no TLS version in common with the broker"),
    "NO_PROTOCOLS_AVAILABLE": ("handshake_refused", "no TLS version in common with the broker"),
    "TLSV1_ALERT_INSUFFICIENT_SECURITY": (
        "handshake_refused", "no cipher in common with the broker"),
    "SSLV3_ALERT_ILLEGAL_PARAMETER": ("handshake_refused", "the broker refused the handshake"),
    "TLSV1_ALERT_DECRYPT_ERROR": (
        "client_certificate_rejected", "the broker could not check the client's signature"),
    "WRONG_VERSION_NUMBER": (
        "not_tls", "the port does not speak TLS (a plain AMQP listener? use ojs:// or the "
        "broker's TLS port)"),
    "UNKNOWN_PROTOCOL": ("not_tls", "the port does not speak TLS"),
    "HTTP_REQUEST": ("not_tls", "the port does not speak TLS"),
    "PACKET_LENGTH_TOO_LONG": ("not_tls", "the port does not speak TLS"),
    "RECORD_LAYER_FAILURE": ("not_tls", "the port does not speak TLS"),
}
#: OpenSSL libraries whose errors come from loading the client's own files.
LOCAL_LIBRARIES = frozenset({"PEM", "X509", "PKCS12", "ASN1", "EVP", "RSA", "EC"})
#: The TLS options that name files, and what each holds.
FILE_OPTIONS = {"ca_certs": "the CA certificates", "certfile": "the client certificate",
                "keyfile": "the client key"}

_warned_unverified: set[str] = set()


def verified_options(option: Any, host: str) -> dict[str, Any]:
    """py-amqp's TLS options for a connection to ``host`` from Celery's
    ``broker_use_ssl`` (``True`` or a dict): what is left out filled in so that the
    broker's certificate is checked against ``host`` (see the module's docstring).

    Raises :class:`~ojs_kombu.spec.errors.OJSConfigurationError` for a value that
    is neither, or a file it names that cannot be read.
    """
    if option is True:
        options: dict[str, Any] = {}
    elif isinstance(option, dict):
        options = dict(option)
    else:
        raise OJSConfigurationError(
            f"broker_use_ssl is {type(option).__name__}: give True or a dict of TLS options "
            "(ca_certs, certfile, keyfile, cert_reqs, server_hostname)")
    for name, what in FILE_OPTIONS.items():
        path = options.get(name)
        if path is not None and not (os.path.isfile(path) and os.access(path, os.R_OK)):
            raise OJSConfigurationError(
                f"broker_use_ssl[{name!r}] names {path!r}, which is not a readable file "
                f"({what})")
    if "context" in options:  # py-amqp's ssl.create_default_context form
        context = dict(options["context"] or {})
        if context.get("check_hostname") is None:
            context["check_hostname"] = True
        elif not context["check_hostname"]:
            _warn_unverified(host, "context check_hostname=False")
        options["context"] = context
    elif options.get("cert_reqs") == ssl.CERT_NONE:
        _warn_unverified(host, "cert_reqs=CERT_NONE")
        return options  # py-amqp cannot check a host name without verifying
    else:
        options.setdefault("cert_reqs", ssl.CERT_REQUIRED)
    if options.get("server_hostname") is None:
        options["server_hostname"] = host
    return options


def _warn_unverified(host: str, how: str) -> None:
    if host not in _warned_unverified:
        _warned_unverified.add(host)
        logger.warning("TLS to %s does not verify the broker (broker_use_ssl %s): whoever "
                       "answers at that address receives the broker password", host, how)


def permanent_failure(exc: BaseException, host: str, port: int | None
                      ) -> BrokerTLSError | None:
    """The :class:`BrokerTLSError` for a TLS failure no retry mends (``None``: retry)."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        kind, why = VERIFY_KINDS.get(exc.verify_code or 0, UNTRUSTED)
        return BrokerCertificateError(host, f"{why} ({exc.verify_message})", port, kind)
    if isinstance(exc, ssl.SSLError):
        reason = getattr(exc, "reason", None) or ""
        if reason in ALERT_KINDS:
            kind, why = ALERT_KINDS[reason]
            return BrokerTLSError(host, port, f"{why} ({reason})", kind)
        if getattr(exc, "library", None) in LOCAL_LIBRARIES:
            return BrokerTLSError(host, port, "the client certificate or key of "
                                  f"broker_use_ssl cannot be used ({exc.library}: {reason})",
                                  "client_certificate_unusable")
    return None


def pending_alert(sock: ssl.SSLSocket) -> ssl.SSLError | None:
    """The TLS alert the broker sent before it closed a connection whose write just
    failed (``None``: none was sent).

    Under TLS 1.3 the broker checks the client's certificate after the client
    finished its handshake: py-amqp writes the AMQP protocol header at once, the
    broker has already sent its alert and closed, and the write fails as a bare
    EOF.  The alert is still in the socket, read here."""
    try:
        sock.recv(1)
    except ssl.SSLError as exc:
        return exc if getattr(exc, "reason", None) in ALERT_KINDS else None
    except (OSError, ValueError):  # closed without an alert, or no handshake to read after
        return None
    return None


def speaks_tls(host: str, port: int, timeout: float | None) -> bool:
    """Whether ``host:port`` answers a TLS handshake (nothing is verified, nothing but
    a ClientHello is sent): a plain connection that the port closed before the
    broker's first frame was made to a TLS listener when it does."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with socket.create_connection((host, port), timeout=timeout or 5.0) as raw, \
                context.wrap_socket(raw) as tls:
            tls.version()
    except ssl.SSLError as exc:  # an alert is TLS speaking (client certificate required)
        return "ALERT" in (getattr(exc, "reason", None) or "")
    except OSError:
        return False
    return True


def plaintext_to_tls(exc: BaseException, host: str, port: int, timeout: float | None
                     ) -> BrokerTLSError | None:
    """A plain AMQP connection whose port closed it before the broker's first frame:
    a :class:`BrokerTLSError` when the port speaks TLS (``None``: retry)."""
    if not isinstance(exc, OSError) or isinstance(exc, (ssl.SSLError, TimeoutError,
                                                        ConnectionRefusedError)):
        return None
    if not speaks_tls(host, port, timeout):
        return None
    return BrokerTLSError(host, port, "the port speaks TLS and closed a plain AMQP "
                          "connection: use ojss:// (or set broker_use_ssl)", "tls_port")


#: The ``(host, port)`` pairs this process has spoken plain AMQP with.  Process-wide,
#: not per connection: kombu makes a new connection for each reconnection attempt.
_SPOKE_PLAIN_AMQP: set[tuple[str, int]] = set()


def spoke_plain_amqp(host: str, port: int) -> None:
    """A plain AMQP connection to ``host:port`` was opened: that port is no TLS port."""
    _SPOKE_PLAIN_AMQP.add((host, port))


def connect_failure(exc: OSError, host: str, port: int, tls: bool, timeout: float | None
                    ) -> BrokerTLSError | None:
    """The :class:`BrokerTLSError` a failed connection to ``host:port`` is, when no retry
    mends it (``None``: kombu retries ``exc``).  A plain AMQP port that answered before
    is not probed for TLS again: a connection closed there before the broker's first
    frame is a cut or a proxy's outage, and a probe would double every reconnection
    attempt."""
    if tls:
        return permanent_failure(exc, host, port)
    if (host, port) in _SPOKE_PLAIN_AMQP:
        return None
    return plaintext_to_tls(exc, host, port, timeout)


@write_failure_hook
class TLSTransport(SSLTransport):
    """py-amqp's TLS transport with the options of :func:`verified_options` (the host
    name checked) and the broker's alert read behind the protocol header's failed write
    (:func:`pending_alert`)."""

    def __init__(self, host: str, connect_timeout: float | None = None, ssl: Any = None,
                 **kwargs: Any) -> None:
        super().__init__(host, connect_timeout=connect_timeout, ssl=ssl, **kwargs)
        self.sslopts = verified_options(ssl, self.host)

    def on_setup_failed(self, exc: OSError) -> BaseException:
        """What the socket set-up's failure ``exc`` is raised as
        (:func:`~ojs_kombu.amqp.wire.py_amqp_seam.write_failure_hook`).  Under TLS 1.3 a
        broker refuses a client certificate after the handshake completed, so it is the
        protocol header's write that fails (EOF, a broken pipe, a reset) while the
        broker's alert, which says why, waits unread on the socket: that alert."""
        sock = self.sock
        if isinstance(exc, (ssl.SSLEOFError, BrokenPipeError, ConnectionResetError)) \
                and isinstance(sock, ssl.SSLSocket):
            return pending_alert(sock) or exc
        return exc
