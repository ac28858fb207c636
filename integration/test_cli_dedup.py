"""``ojs-kombu dedup show|clear`` against the records a real worker wrote in Redis.

The use it exists for: a keyed job ran, so every later job with that key is an
acked duplicate; ``clear`` makes the key run again.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from celery import Celery

from ojs_kombu.celery.dedup_store import DedupStore
from ojs_kombu.spec.job_ids import new_job_id

from .conftest import wait_until
from .dedupapp import REDIS, make_dedup_app
from .test_cli import run, run_bare
from .test_dedup import dedup_worker, runs

STORE = f"{REDIS}/2"


def test_show_then_clear_lets_a_completed_key_run_again(broker_url: str, tmp_path: Path) -> None:
    producer: Celery = make_dedup_app(broker_url)
    count = producer.tasks["dedup.count"]
    tag = uuid.uuid4().hex
    key = f"{tag}:charge"
    worker = dedup_worker(broker_url, "dedup-cli", tmp_path / "worker.log")
    try:
        assert count.apply_async((tag, 1), queue="dedup-cli",
                                 ojs_idempotency_key=key).get(timeout=60) == 2
        count.apply_async((tag, 1), queue="dedup-cli", ojs_idempotency_key=key).get(timeout=60)
        assert runs(tag) == {key: 1}  # the second was a duplicate

        shown = run(broker_url, "-A", "integration.dedupapp", "dedup", "show", "key", key,
                    "--json")
        assert shown.returncode == 0, shown.stderr
        record = json.loads(shown.stdout)
        assert (record["kind"], record["name"], record["state"]) == ("key", key, "completed")
        assert 0 < int(record["ttl_ms"]) <= 86_400_000

        human = run(broker_url, "dedup", "show", "key", key, "--dedup-url", STORE)
        assert human.returncode == 0 and "state: completed" in human.stdout, human.stderr

        cleared = run(broker_url, "dedup", "clear", "key", key, "--dedup-url", STORE, "--yes")
        assert cleared.returncode == 0 and "deleted idempotency key" in cleared.stdout

        count.apply_async((tag, 1), queue="dedup-cli", ojs_idempotency_key=key).get(timeout=60)
        assert runs(tag) == {key: 2}  # cleared: the key ran again

        slow_key, gate = f"{tag}:slow", tmp_path / "gate"
        slow = count.apply_async((tag, 2, 120.0, str(gate)), queue="dedup-cli",
                                 ojs_idempotency_key=slow_key)
        wait_until(lambda: json.loads(run(broker_url, "dedup", "show", "key", slow_key,
                                          "--dedup-url", STORE, "--json").stdout
                                      ).get("state") == "running", 30, "the slow job starts")
        refused = run(broker_url, "dedup", "clear", "key", slow_key, "--dedup-url", STORE,
                      "--yes")
        assert refused.returncode == 1, refused.stderr
        assert f"held by running job {slow.id}" in refused.stderr and "--force" in refused.stderr
        gate.touch()  # the slow job may finish now
        assert slow.get(timeout=60) == 4
        assert runs(tag)[slow_key] == 1
    finally:
        worker.stop()


def test_exit_codes_name_what_is_wrong(broker_url: str) -> None:
    missing = run(broker_url, "dedup", "show", "key", f"absent-{uuid.uuid4().hex}",
                  "--dedup-url", STORE, "--json")
    assert missing.returncode == 4
    assert json.loads(missing.stdout)["error"] == "not_found"
    assert "no idempotency key" in missing.stderr

    not_cleared = run(broker_url, "dedup", "clear", "unique", "f" * 64, "--dedup-url", STORE,
                      "--yes")
    assert not_cleared.returncode == 4 and "no unique fingerprint" in not_cleared.stderr

    down = run(broker_url, "dedup", "show", "key", "k", "--dedup-url", "redis://127.0.0.1:1/0")
    assert down.returncode == 3 and "127.0.0.1:1/0" in down.stderr

    unset = run_bare("dedup", "show", "key", "k", env={"OJS_DEDUP_URL": ""})
    assert unset.returncode == 2 and "--dedup-url" in unset.stderr

    malformed = run(broker_url, "dedup", "show", "key", "k", "--dedup-url", "localhost:6379",
                    "--json")
    assert malformed.returncode == 2 and json.loads(malformed.stdout)["error"] == "invalid_input"
    assert "invalid dedup store URL 'localhost:6379'" in malformed.stderr


def test_clear_asks_first_showing_the_record(broker_url: str) -> None:
    store = DedupStore(STORE, 60.0)
    key, job_id = f"asked-{uuid.uuid4().hex}", new_job_id()
    store.claim_key(key, job_id=job_id, attempt=1, redelivered=False)
    store.finish_key(key, job_id=job_id, attempt=1, completed=True)
    try:
        asked = run(broker_url, "dedup", "clear", "key", key, "--dedup-url", STORE,
                    input="n\n")
        assert asked.returncode == 1
        assert f"Delete idempotency key '{key}'" in asked.stderr
        assert f"completed, job {job_id}" in asked.stderr
        assert store.show("key", key) is not None  # declined: kept
        cleared = run(broker_url, "dedup", "clear", "key", key, "--dedup-url", STORE, "--json",
                      input="y\n")
        assert cleared.returncode == 0, cleared.stderr
        assert json.loads(cleared.stdout)["job_id"] == job_id
        assert store.show("key", key) is None
    finally:
        store.clear("key", key)
        store.close()
