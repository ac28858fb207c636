"""The store of unique records and idempotency keys: Redis, one atomic script per step.

Each step is a Lua script, so a claim is one round trip and two producers or
workers never both win it; every record carries a ``PEXPIRE`` (the unique
policy's ``period``, else ``ojs_dedup_retention``), so memory is bounded and
no record outlives its window, even one whose holder was killed.  The rules
the scripts apply are :mod:`ojs_kombu.spec.unique`'s.

Records are small hashes: ``ojs:unique:{fingerprint}`` holds the job id
(``j``), its lifecycle state (``s``), queue (``q``), schedule (``t``) and the
states the policy checks (``c``); ``ojs:key:{key}`` holds the state
(``running``/``completed``), job id and attempt.  ``ojs:replaced:{job id}``
names the job that replaced it (``on_conflict: replace``), for the policy's
period: the replaced job never runs, even where its CANCEL comes late and the
job that replaced it has already completed (and left the record).  Why Redis and not the result
backend: a claim must be atomic and expire by itself; PostgreSQL could do both
(``INSERT ... ON CONFLICT`` and a reaper) and is not offered yet.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from dataclasses import dataclass
from typing import Any

from ..spec.errors import DedupNotConfigured, DedupUnavailable, OJSConfigurationError
from ..spec.unique import RunVerdict

_CLAIM_UNIQUE = """
local by = redis.call('GET', KEYS[2])
if by then return {by, 'replaced', '', ''} end
local v = redis.call('HMGET', KEYS[1], 'j', 's', 'q', 't')
if v[1] and v[1] ~= ARGV[1] and v[1] ~= ARGV[7]
    and string.find(',' .. ARGV[5] .. ',', ',' .. v[2] .. ',', 1, true) then
  return {v[1], v[2], v[3], v[4]}
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'j', ARGV[1], 's', ARGV[2], 'q', ARGV[3], 't', ARGV[4], 'c', ARGV[5])
redis.call('PEXPIRE', KEYS[1], ARGV[6])
if ARGV[7] ~= '' then redis.call('SET', KEYS[3], ARGV[1], 'PX', ARGV[6]) end
return {}
"""
_SET_UNIQUE_STATE = """
if redis.call('HGET', KEYS[1], 'j') ~= ARGV[1] then return 0 end
local checked = redis.call('HGET', KEYS[1], 'c') or ''
if string.find(',' .. checked .. ',', ',' .. ARGV[2] .. ',', 1, true) then
  redis.call('HSET', KEYS[1], 's', ARGV[2])
  return 1
end
redis.call('DEL', KEYS[1])
return 2
"""
_CLAIM_KEY = """
local v = redis.call('HMGET', KEYS[1], 's', 'j', 'a')
if v[1] then
  if v[1] == 'completed' then return {'duplicate', v[2]} end
  if not (v[2] == ARGV[1] and (tonumber(ARGV[2]) > tonumber(v[3]) or ARGV[3] == '1')) then
    return {'busy', v[2]}
  end
end
redis.call('HSET', KEYS[1], 's', 'running', 'j', ARGV[1], 'a', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return {'run', ARGV[1]}
"""
_FINISH_KEY = """
local owner = redis.call('HGET', KEYS[1], 'j')
if owner and owner ~= ARGV[1] then return 0 end
if ARGV[2] == 'completed' then
  redis.call('HSET', KEYS[1], 's', 'completed', 'j', ARGV[1], 'a', ARGV[3])
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
  return 1
end
if owner and redis.call('HGET', KEYS[1], 's') == 'running' then
  redis.call('DEL', KEYS[1])
end
return 2
"""

_CLEAR_IF_HELD = """
if redis.call('HGET', KEYS[1], 'j') ~= ARGV[1] then return 0 end
return redis.call('DEL', KEYS[1])
"""

UNIQUE_PREFIX, KEY_PREFIX, REPLACED_PREFIX = "ojs:unique:", "ojs:key:", "ojs:replaced:"
#: The state :meth:`DedupStore.claim_unique` reports for a job that was replaced.
REPLACED = "replaced"
logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class UniqueRecord:
    """The job that holds a fingerprint."""

    job_id: str
    state: str
    queue: str
    scheduled_at: str | None


def require_redis() -> Any:
    """The ``redis`` package, or a configuration error that says how to get it."""
    try:
        import redis
    except ImportError:  # pragma: no cover - the test environment has it
        raise OJSConfigurationError(
            "ojs_dedup_url is set but the 'redis' package is not installed: "
            "pip install 'ojs-kombu[dedup]'") from None
    return redis


class DedupStore:
    """Unique records and idempotency keys on one Redis database."""

    def __init__(self, url: str, retention_s: float, namespace: str = "") -> None:
        redis = require_redis()
        self.url = url
        self.retention_ms = max(1, int(retention_s * 1000))
        self._namespace = f"{namespace}:" if namespace else ""
        self.client = redis.Redis.from_url(url, socket_timeout=2.0,
                                           socket_connect_timeout=2.0)
        self._errors: tuple[type[BaseException], ...] = (redis.RedisError, OSError)
        self._claim_unique = _Script(_CLAIM_UNIQUE)
        self._set_unique_state = _Script(_SET_UNIQUE_STATE)
        self._claim_key = _Script(_CLAIM_KEY)
        self._finish_key = _Script(_FINISH_KEY)
        self._wire = _Wire(self.client, redis.exceptions,
                           [self._claim_unique, self._set_unique_state, self._claim_key,
                            self._finish_key])

    def unique_key(self, fingerprint: str) -> str:
        return f"{self._namespace}{UNIQUE_PREFIX}{fingerprint}"

    def idempotency_key(self, key: str) -> str:
        return f"{self._namespace}{KEY_PREFIX}{key}"

    def replaced_key(self, job_id: str) -> str:
        return f"{self._namespace}{REPLACED_PREFIX}{job_id}"

    def _call(self, script: _Script, keys: list[str], args: list[Any],
              deferred: bool = False) -> Any:
        try:
            return self._wire.run(script, keys, args, deferred)
        except self._errors as exc:
            raise DedupUnavailable(f"the dedup store at {self._where()} did not answer: "
                                   f"{exc}") from exc

    def _where(self) -> str:
        return self.url.split("@")[-1]

    # -- unique jobs -------------------------------------------------------------

    def claim_unique(self, fingerprint: str, *, job_id: str, state: str, queue: str,
                     scheduled_at: str | None, checked: tuple[str, ...], ttl_ms: int,
                     take_over_from: str = "") -> UniqueRecord | None:
        """Claim the fingerprint for ``job_id``; the conflicting record (held by another
        job, in a checked state, other than ``take_over_from``) when there is one, or,
        when another job replaced ``job_id``, that job with state :data:`REPLACED`.
        Taking over from ``take_over_from`` marks it replaced for ``ttl_ms``."""
        found = self._call(self._claim_unique,
                           [self.unique_key(fingerprint), self.replaced_key(job_id),
                            self.replaced_key(take_over_from or job_id)],
                           [job_id, state, queue, scheduled_at or "", ",".join(checked),
                            ttl_ms, take_over_from])
        if not found:
            return None
        owner, owner_state, owner_queue, when = (_text(part) for part in found)
        return UniqueRecord(owner, owner_state, owner_queue, when or None)

    def set_unique_state(self, fingerprint: str, job_id: str, state: str) -> None:
        """The job's lifecycle state, if it still holds the fingerprint; a state the
        policy does not check removes the record (it no longer blocks)."""
        self._call(self._set_unique_state, [self.unique_key(fingerprint)], [job_id, state])

    def release_unique(self, fingerprint: str, job_id: str) -> None:
        """Give the fingerprint back (the claimed job was never published)."""
        self.set_unique_state(fingerprint, job_id, "released")

    # -- idempotency keys --------------------------------------------------------

    def claim_key(self, key: str, *, job_id: str, attempt: int,
                  redelivered: bool) -> tuple[RunVerdict, str]:
        """Whether this delivery runs (:func:`ojs_kombu.spec.unique.run_verdict`), and
        the job that holds the key."""
        verdict, owner = self._call(self._claim_key, [self.idempotency_key(key)],
                                    [job_id, attempt, "1" if redelivered else "0",
                                     self.retention_ms])
        return RunVerdict(_text(verdict)), _text(owner)

    def finish_key(self, key: str, *, job_id: str, attempt: int, completed: bool) -> None:
        """Completed: the key is a duplicate for ``ojs_dedup_retention``.  Failed: the
        key is free again, for the retry or a later delivery.  Written at once, its
        reply read with the next call (see :class:`_Wire`)."""
        self._call(self._finish_key, [self.idempotency_key(key)],
                   [job_id, "completed" if completed else "failed", attempt,
                    self.retention_ms], deferred=True)

    # -- seeing and clearing -----------------------------------------------------

    def show(self, kind: str, name: str) -> dict[str, Any] | None:
        """A record as a dict with its remaining lifetime (``ttl_ms``), or ``None``.
        ``kind`` is ``"key"`` (an idempotency key) or ``"unique"`` (a fingerprint)."""
        redis_key = self.record_key(kind, name)
        try:  # one transaction: a record that expires in between is never shown with -2
            raw, ttl = self.client.pipeline(transaction=True).hgetall(redis_key) \
                .pttl(redis_key).execute()
        except self._errors as exc:
            raise DedupUnavailable(f"the dedup store at {self._where()} did not answer: "
                                   f"{exc}") from exc
        if not raw:
            return None
        record = {_text(k): _text(v) for k, v in raw.items()}
        return {**record, "ttl_ms": ttl}

    def clear(self, kind: str, name: str, *, held_by: str | None = None) -> bool:
        """Delete a record (a key that must run again, a fingerprint that must stop
        blocking); whether there was one.  With ``held_by``, only while that job still
        holds it (what was shown is what is deleted; a record taken over since stays)."""
        redis_key = self.record_key(kind, name)
        try:
            if held_by is None:
                return bool(self.client.delete(redis_key))
            return bool(self.client.eval(_CLEAR_IF_HELD, 1, redis_key, held_by))
        except self._errors as exc:
            raise DedupUnavailable(f"the dedup store at {self._where()} did not answer: "
                                   f"{exc}") from exc

    def memory_usage(self, kind: str, name: str) -> int | None:
        """Bytes Redis holds for one record (``MEMORY USAGE``)."""
        return self.client.memory_usage(self.record_key(kind, name), samples=0)

    def record_key(self, kind: str, name: str) -> str:
        """The Redis key of a record: ``kind`` ``"key"`` or ``"unique"``."""
        if kind == "key":
            return self.idempotency_key(name)
        if kind == "unique":
            return self.unique_key(name)
        raise ValueError(f"kind is 'key' or 'unique', not {kind!r}")

    def close(self) -> None:
        self._wire.close()
        self.client.close()


class _Script:
    """A Lua script and its SHA1, for ``EVALSHA``."""

    def __init__(self, source: str) -> None:
        self.source = source.encode()
        self.sha = hashlib.sha1(self.source).hexdigest().encode()


def _pack(parts: list[bytes]) -> bytes:
    """One command in RESP (``*n``, then ``$len`` and each argument)."""
    out = [b"*%d\r\n" % len(parts)]
    for part in parts:
        out.append(b"$%d\r\n%s\r\n" % (len(part), part))
    return b"".join(out)


def _bytes(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


class _Wire:
    """The process's own connection for the scripts, written as RESP directly.

    A keyed job makes two script calls in the pool; through ``redis.Redis`` each
    costs about 0.1 ms of CPU in the client (argument encoding, pool checkout,
    instrumentation), through one held connection about a quarter of that.  A
    deferred call (the key's completion) is written at once and its reply read
    with the next call's: Redis runs a connection's commands in order, so the
    record is written before the job's ack leaves the worker, and a keyed job
    costs one round trip instead of two.
    """

    def __init__(self, client: Any, errors: Any, scripts: list[_Script]) -> None:
        self._pool = client.connection_pool
        self._errors = errors
        self._scripts = scripts
        self._connection: Any = None
        self._pending = 0
        self._lock = threading.Lock()

    def run(self, script: _Script, keys: list[str], args: list[Any],
            deferred: bool = False) -> Any:
        head = [b"EVALSHA", script.sha, b"%d" % len(keys)]
        packed = _pack([*head, *(key.encode() for key in keys), *map(_bytes, args)])
        with self._lock:
            connection = self._connection or self._connect()
            try:
                connection.send_packed_command([packed], check_health=False)
                self._read_pending(connection)
                if deferred:
                    self._pending += 1
                    return None
                try:
                    return connection.read_response()
                except self._errors.NoScriptError:  # SCRIPT FLUSH since we connected
                    self._load(connection)
                    connection.send_packed_command([packed], check_health=False)
                    return connection.read_response()
            except BaseException:
                self._connection, self._pending = None, 0
                connection.disconnect()
                raise

    def _connect(self) -> Any:
        connection = self._pool.make_connection()
        self._load(connection)
        self._connection = connection
        return connection

    def _load(self, connection: Any) -> None:
        for script in self._scripts:
            connection.send_packed_command([_pack([b"SCRIPT", b"LOAD", script.source])])
        for _ in self._scripts:
            connection.read_response()

    def _read_pending(self, connection: Any) -> None:
        while self._pending:
            self._pending -= 1
            try:
                connection.read_response()
            except self._errors.ResponseError as exc:
                logger.warning("dedup degraded: a record update was refused: %s", exc)

    def close(self) -> None:
        with self._lock:
            if self._connection is not None:
                try:
                    self._read_pending(self._connection)
                finally:
                    self._connection.disconnect()
                    self._connection, self._pending = None, 0


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


_stores: dict[tuple[int, str, float, str], DedupStore] = {}
_stores_lock = threading.Lock()


def store_for(settings: Any) -> DedupStore:
    """The process's store for an app's settings (one client per process: a pool
    process forked from the worker opens its own), or :class:`DedupNotConfigured`."""
    url = settings.dedup_url
    if not url:
        raise DedupNotConfigured(
            "this job asks for ojs_unique or ojs_idempotency_key, and the app has no "
            "ojs_dedup_url: set app.conf.ojs_dedup_url = 'redis://host:6379/0' "
            "(pip install 'ojs-kombu[dedup]'); nothing was sent")
    key = (os.getpid(), url, settings.dedup_retention, settings.prefix)
    store = _stores.get(key)
    if store is None:
        with _stores_lock:
            store = _stores.get(key)
            if store is None:
                store = _stores[key] = DedupStore(url, settings.dedup_retention,
                                                  settings.prefix)
    return store
