"""Entry point for ``celery -A integration.hostileapp worker``: the app of the hostile
job tests (integration/test_hostile_storm.py, integration/test_internal_tasks.py).

``hostile.count`` counts its runs per job id in Redis (every pool process sees the
same counts); ``OJS_TEST_RESULT_BACKEND`` is the result backend (``none``: none),
``OJS_TEST_MAX_TYPE_MAP_ENTRIES``, ``OJS_TEST_MAX_JOB_BYTES`` and
``OJS_TEST_CHORD_UNLOCK_MAX_RETRIES`` set ``ojs_max_type_map_entries``,
``ojs_max_job_bytes`` and ``ojs_chord_unlock_max_retries``.
"""

from __future__ import annotations

import os
from typing import Any

import redis
from celery import Celery

import ojs_kombu

#: Where ``hostile.count`` counts (``hostile:<job id>`` -> runs); the tests read it there.
RUNS_URL = "redis://127.0.0.1:6379/13"

app = Celery("hostile", broker=os.environ["OJS_TEST_BROKER_URL"])
ojs_kombu.install(app)
backend = os.environ.get("OJS_TEST_RESULT_BACKEND", "none")
app.conf.update(result_backend=None if backend == "none" else backend,
                worker_prefetch_multiplier=16, result_chord_retry_interval=0.2,
                worker_hijack_root_logger=False)
if "OJS_TEST_MAX_TYPE_MAP_ENTRIES" in os.environ:
    app.conf.ojs_max_type_map_entries = int(os.environ["OJS_TEST_MAX_TYPE_MAP_ENTRIES"])
if "OJS_TEST_MAX_JOB_BYTES" in os.environ:
    app.conf.ojs_max_job_bytes = int(os.environ["OJS_TEST_MAX_JOB_BYTES"])
if "OJS_TEST_CHORD_UNLOCK_MAX_RETRIES" in os.environ:
    app.conf.ojs_chord_unlock_max_retries = int(os.environ["OJS_TEST_CHORD_UNLOCK_MAX_RETRIES"])
runs = redis.Redis.from_url(RUNS_URL)


@app.task(name="hostile.count", bind=True)
def count(self: Any, *args: Any, **kwargs: Any) -> int:
    return int(runs.incr("hostile:" + self.request.id))
