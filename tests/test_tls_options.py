"""TLS options and failures (ojs_kombu.amqp.broker.tls): what ``ojss://`` verifies by
default, and which handshake failures are permanent (no broker; the real TLS broker
is integration/test_tls_failures.py)."""

from __future__ import annotations

import logging
import pickle
import socket
import ssl
from pathlib import Path

import pytest

from ojs_kombu import BrokerCertificateError, BrokerTLSError, OJSConfigurationError
from ojs_kombu.amqp.broker.tls import (
    connect_failure,
    permanent_failure,
    plaintext_to_tls,
    spoke_plain_amqp,
    verified_options,
)


@pytest.fixture
def pem(tmp_path: Path) -> str:
    path = tmp_path / "ca.pem"
    path.write_text("not read here: only its presence is checked\n")
    return str(path)


def test_the_documented_options_check_the_url_host(pem: str) -> None:
    documented = {"ca_certs": pem, "certfile": pem, "keyfile": pem,
                  "cert_reqs": ssl.CERT_REQUIRED}
    options = verified_options(documented, "rabbit1.example.com")
    assert options == {**documented, "server_hostname": "rabbit1.example.com"}
    assert "server_hostname" not in documented  # the app's setting is not changed


def test_true_verifies_against_the_system_cas_and_the_host() -> None:
    assert verified_options(True, "10.0.0.7") == {"cert_reqs": ssl.CERT_REQUIRED,
                                                  "server_hostname": "10.0.0.7"}


def test_an_explicit_server_hostname_wins_and_none_means_the_url_host(pem: str) -> None:
    assert verified_options({"ca_certs": pem, "server_hostname": "broker.internal"},
                            "10.0.0.7")["server_hostname"] == "broker.internal"
    assert verified_options({"server_hostname": None}, "h")["server_hostname"] == "h"


def test_the_context_form_checks_the_host_name() -> None:
    options = verified_options({"context": {"cafile": None}}, "h")
    assert options["context"]["check_hostname"] is True and options["server_hostname"] == "h"


@pytest.mark.parametrize("opt_out", [{"cert_reqs": ssl.CERT_NONE},
                                     {"context": {"check_hostname": False}}])
def test_turning_verification_off_is_explicit_and_warned(
        opt_out: dict[str, object], caplog: pytest.LogCaptureFixture) -> None:
    host = f"unverified-{len(opt_out['context']) if 'context' in opt_out else 0}.example"
    with caplog.at_level(logging.WARNING):
        options = verified_options(opt_out, host)
    assert options.get("cert_reqs") != ssl.CERT_REQUIRED
    assert any(host in r.getMessage() and "password" in r.getMessage()
               for r in caplog.records)


def test_a_file_that_cannot_be_read_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(OJSConfigurationError, match="certfile.*not a readable file"):
        verified_options({"certfile": str(tmp_path / "missing.pem")}, "h")
    with pytest.raises(OJSConfigurationError, match="True or a dict"):
        verified_options("yes", "h")


def _ssl_error(reason: str, library: str = "SSL") -> ssl.SSLError:
    error = ssl.SSLError(1, f"[{library}: {reason}] ...")
    error.reason, error.library = reason, library
    return error


def _verify_error(code: int) -> ssl.SSLCertVerificationError:
    error = ssl.SSLCertVerificationError(1, "certificate verify failed")
    error.verify_code, error.verify_message = code, "verify message"
    error.reason, error.library = "CERTIFICATE_VERIFY_FAILED", "SSL"
    return error


@pytest.mark.parametrize(("error", "kind"), [
    (_verify_error(62), "hostname_mismatch"),
    (_verify_error(64), "hostname_mismatch"),
    (_verify_error(10), "server_certificate_expired"),
    (_verify_error(19), "server_certificate_untrusted"),
    (_ssl_error("TLSV13_ALERT_CERTIFICATE_REQUIRED"), "client_certificate_required"),
    (_ssl_error("TLSV1_ALERT_UNKNOWN_CA"), "client_certificate_rejected"),
    (_ssl_error("SSLV3_ALERT_BAD_CERTIFICATE"), "client_certificate_rejected"),
    (_ssl_error("SSLV3_ALERT_CERTIFICATE_EXPIRED"), "client_certificate_expired"),
    (_ssl_error("SSLV3_ALERT_HANDSHAKE_FAILURE"), "handshake_refused"),
    (_ssl_error("WRONG_VERSION_NUMBER"), "not_tls"),
    (_ssl_error("KEY_VALUES_MISMATCH", "X509"), "client_certificate_unusable"),
])
def test_a_failure_no_retry_mends_is_typed(error: ssl.SSLError, kind: str) -> None:
    failure = permanent_failure(error, "rabbit1.example.com", 5671)
    assert isinstance(failure, BrokerTLSError) and failure.kind == kind
    assert "rabbit1.example.com:5671" in str(failure)
    assert isinstance(failure, BrokerCertificateError) == kind.startswith(
        ("hostname", "server_certificate"))
    copy = pickle.loads(pickle.dumps(failure))  # crosses a process pool intact
    assert type(copy) is type(failure) and str(copy) == str(failure)


@pytest.mark.parametrize("error", [
    ConnectionRefusedError(111, "Connection refused"), TimeoutError("timed out"),
    ConnectionResetError(104, "Connection reset by peer"), ssl.SSLEOFError(8, "EOF"),
    _ssl_error("SSLV3_ALERT_CLOSE_NOTIFY_UNKNOWN_REASON"),
])
def test_a_broker_that_is_down_is_retried(error: OSError) -> None:
    assert permanent_failure(error, "h", 5671) is None


def test_a_closed_plain_connection_is_retried_when_the_port_does_not_speak_tls() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:  # accepts, answers nothing TLS
        port = listener.getsockname()[1]
        listener.settimeout(5)

        def closed(exc: OSError) -> BrokerTLSError | None:
            return plaintext_to_tls(exc, "127.0.0.1", port, 2.0)

        import threading

        def refuse_tls() -> None:
            connection, _ = listener.accept()
            with connection:
                connection.recv(512)
                connection.sendall(b"AMQP\x00\x00\x09\x01")  # a plain AMQP listener's answer

        thread = threading.Thread(target=refuse_tls)
        thread.start()
        assert closed(ConnectionResetError(104, "reset")) is None
        thread.join()
    assert plaintext_to_tls(ConnectionRefusedError(111, "refused"), "127.0.0.1", 1, 1) is None


def test_a_plain_port_that_answered_before_is_not_probed_for_tls_again() -> None:
    """A cut on a port this process spoke plain AMQP with is retried as it is: no TLS
    probe (which would make each reconnection attempt two connections)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        spoke_plain_amqp("127.0.0.1", port)
        cut = ConnectionResetError(104, "Connection reset by peer")
        assert connect_failure(cut, "127.0.0.1", port, False, 0.5) is None
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):  # nothing connected to probe it
            listener.accept()
