"""RabbitMQ's management HTTP API, for the suites' administration of the broker.

Each ``rabbitmqctl`` call starts an Erlang VM (about 0.6 s of CPU); the suites
create and delete a vhost, a user or a permission some hundred times a run.
Where the management plugin answers (``OJS_TEST_RABBITMQ_API``, else port 15672
of the broker under test), those commands go over HTTP instead
(:func:`integration.conftest.rabbitmqctl`); where it does not (a fresh RabbitMQ
without ``rabbitmq_management``), ``rabbitmqctl`` runs them as before.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

HOST = os.environ.get("OJS_TEST_RABBITMQ_HOST", "127.0.0.1")
#: The API's base URL, credentials in it (sent as Basic auth).
MANAGEMENT_API = os.environ.get("OJS_TEST_RABBITMQ_API", f"http://guest:guest@{HOST}:15672/api/")


def request(method: str, path: str, body: dict[str, Any] | None = None,
            timeout: float = 30.0) -> Any:
    """``METHOD {MANAGEMENT_API}{path}``'s JSON answer (None when it has no body);
    an error status raises ``urllib.error.HTTPError`` with the broker's reason."""
    parts = urllib.parse.urlsplit(MANAGEMENT_API)
    netloc = f"{parts.hostname}:{parts.port}" if parts.port else str(parts.hostname)
    url = urllib.parse.urlunsplit(parts._replace(netloc=netloc)) + path
    data = None if body is None else json.dumps(body).encode()
    sent = urllib.request.Request(url, data=data, method=method)
    credentials = (f"{urllib.parse.unquote(parts.username or 'guest')}:"
                   f"{urllib.parse.unquote(parts.password or 'guest')}")
    sent.add_header("Authorization", "Basic " + base64.b64encode(credentials.encode()).decode())
    if data is not None:
        sent.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(sent, timeout=timeout) as response:
        text = response.read()
    return json.loads(text) if text else None


@functools.cache
def answers() -> bool:
    """Whether the management API answers (asked once per process)."""
    try:
        request("GET", "overview", timeout=5)
    except (OSError, ValueError):
        return False
    return True


def _quoted(name: str) -> str:
    return urllib.parse.quote(name, safe="")


def administer(args: tuple[str, ...]) -> bool:
    """Run one administration command given as ``rabbitmqctl`` arguments over the API:
    ``add_vhost V``, ``delete_vhost V``, ``add_user U P``, ``delete_user U``,
    ``delete_queue -p V Q`` and ``set_permissions -p V U CONF WRITE READ``.  False when
    it is not one of these or the API does not answer (the caller runs ``rabbitmqctl``)."""
    if not answers():
        return False
    match args:
        case ("add_vhost", vhost):
            request("PUT", f"vhosts/{_quoted(vhost)}", {})
        case ("delete_vhost", vhost):
            request("DELETE", f"vhosts/{_quoted(vhost)}")
        case ("add_user", user, password):
            request("PUT", f"users/{_quoted(user)}", {"password": password, "tags": ""})
        case ("delete_user", user):
            request("DELETE", f"users/{_quoted(user)}")
        case ("delete_queue", "-p", vhost, queue):
            request("DELETE", f"queues/{_quoted(vhost)}/{_quoted(queue)}")
        case ("set_permissions", "-p", vhost, user, configure, write, read):
            request("PUT", f"permissions/{_quoted(vhost)}/{_quoted(user)}",
                    {"configure": configure, "write": write, "read": read})
        case _:
            return False
    return True


def sampled_counts(vhost: str) -> dict[str, tuple[int, int]] | None:
    """``{queue: (ready, unacked)}`` of ``vhost`` as the management API last sampled
    them, or None where it does not answer or has not sampled every queue yet.

    The API's counts are up to RabbitMQ's statistics interval old (5 s by default), so
    a wait polls them and asks ``rabbitmqctl`` (exact, ~0.7 s of CPU a run) only to
    confirm what they show: a stale sample costs the wait a few seconds, never a wrong
    answer."""
    if not answers():
        return None
    listed = request("GET", f"queues/{_quoted(vhost)}?columns=name,messages_ready,"
                     "messages_unacknowledged")
    counts = {}
    for queue in listed:
        ready, unacked = queue.get("messages_ready"), queue.get("messages_unacknowledged")
        if not isinstance(ready, int) or not isinstance(unacked, int):
            return None
        counts[queue["name"]] = (ready, unacked)
    return counts
