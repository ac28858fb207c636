"""Every user-visible difference from plain Celery: one list, two readers.

docs/differences.rst renders :data:`DIFFERENCES` (``.. ojs-differences::``), and
``ojs-kombu migrate check`` reports each one the app meets, with where in the app
(:mod:`.migrate_differences` holds a detector per row, reading the app's
configuration, its tasks and the call sites of its code); the rest in one line
with the link to the page.  ``met_by`` says, for both readers, what in an app
makes the check report the row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

DOCS_PAGE = "docs/differences.rst"


@dataclass(frozen=True)
class Difference:
    anchor: str
    kind: Literal["refused", "different"]
    #: One line, plain text: what ``migrate check`` prints.
    summary: str
    #: reStructuredText: what ojs_kombu does, and why.
    what: str
    why: str
    #: Plain text: what in an app makes ``migrate check`` report it.
    met_by: str = ""

    @property
    def link(self) -> str:
        return f"{DOCS_PAGE}#{self.anchor}"


DIFFERENCES: tuple[Difference, ...] = (
    Difference(
        "task-names", "refused",
        "task names outside the OJS type grammar need a mapping",
        "task names that are not OJS types, unless mapped (``ojs_job_types``, ``ojs_type=``): "
        "``JobTypeError`` (:ref:`mapping`)",
        "The OJS ``type`` is what other producers and consumers of the job see; a name "
        "outside the spec's grammar would be a job no other OJS consumer accepts.",
        met_by='a task mapped with ojs_job_types or ojs_type, or one that needs a mapping'),
    Difference(
        "queue-names", "refused",
        "queue names outside the OJS grammar, reserved prefixes and exchange routes are "
        "refused",
        "queue names outside the OJS grammar unless aliased (``ojs_queue_aliases``) and names "
        "starting with ``dlx.``, ``retry.``, ``control.``, ``schedule.``, ``dropped.`` or "
        "``ready.``: ``QueueNameError``; routes to another exchange (``exchange=``/"
        "``routing_key=``): ``JobRoutingError``, tasks are routed by queue only",
        "OJS queue names have a grammar, and the reserved prefixes name another queue's "
        "dead-letter, retry, control, dropped-job or ready queue, or the scheduling ladder.  "
        "The binding publishes every job to ``ojs.exchange.direct`` with its queue as routing "
        "key (AMQP-005), so any OJS client finds it by queue.",
        met_by=("a queue or route migrate check refuses, an ojs_queue_aliases entry, a task's"
                " exchange/routing_key, a call's queue= that is not an OJS queue name, "
                'exchange= or routing_key=')),
    Difference(
        "serializers", "refused",
        "serializers other than JSON, and compression, are refused",
        "serializers other than JSON (pickle, msgpack, yaml) and ``task_compression``: "
        "``UnsupportedSerializerError``.  ``install()`` takes pickle out of "
        "``accept_content``/``result_accept_content`` and makes a pickle "
        "``result_serializer``/``event_serializer`` JSON; a worker whose app sets pickle "
        "again does not start",
        "An OJS job is JSON (AMQP-010, 013) that any language reads; pickle in a consumer "
        "runs code from the message.",
        met_by=('a non-JSON task_serializer, result or event serializer, pickle in '
                "accept_content, compression, a task's serializer/compression, a call's "
                'serializer= or compression=')),
    Difference(
        "priority-range", "refused",
        "priority outside -100..100 raises JobOptionError (Celery takes 0..255)",
        "a ``priority`` that is not an integer from -100 to 100 (OJS's range; Celery takes "
        "0..255): ``JobOptionError``, never clamped",
        "It is the OJS range; a clamped priority would mean something else to other "
        "consumers of the job.",
        met_by="a task_default_priority, task priority or call's priority= outside -100..100"),
    Difference(
        "long-countdowns", "refused",
        "countdown/eta more than 49.7 days ahead raises JobEncodeError",
        "``countdown``/``eta`` more than 2\\ :sup:`32` - 1 ms (49.7 days) ahead: "
        "``JobEncodeError`` (plain Celery keeps such a job in a worker's memory)",
        "The broker holds scheduled jobs, on a ladder of 32 TTL levels that reaches "
        "2\\ :sup:`32` - 1 ms; no worker holds them.",
        met_by=("a call's countdown= or eta= (a timedelta) beyond 49.7 days, a task's "
                'default_retry_delay or retry_backoff_max beyond it')),
    Difference(
        "time-limits-and-size", "refused",
        "negative or inconsistent time limits, and jobs over ojs_max_job_bytes, are refused",
        "``time_limit``/``soft_time_limit`` that are not seconds >= 0, or a soft limit above "
        "the hard one: ``JobOptionError``; a job larger than ``ojs_max_job_bytes``: "
        "``JobTooLargeError``",
        "The envelope's ``timeout`` is whole seconds >= 0; RabbitMQ refuses a message above "
        "``max_message_size`` with a 406 that names no job, so the producer refuses it "
        "first, naming it.",
        met_by=("negative or inconsistent time limits in the settings, a task's options or a "
                "call's time_limit=/soft_time_limit=")),
    Difference(
        "acks-late", "refused",
        "tasks with acks_late=False or acks_on_failure_or_timeout=True stop the worker",
        "tasks with ``acks_late=False`` or ``acks_on_failure_or_timeout=True``: the worker "
        "does not start (``install()`` sets ``task_acks_late=True`` and "
        "``task_acks_on_failure_or_timeout=False``)",
        "A job is acked only after it ran, so that a failed one is nacked into its "
        "dead-letter queue (AMQP-008, 009) instead of acked and lost.",
        met_by='a task with acks_late=False or acks_on_failure_or_timeout=True (a blocker)'),
    Difference(
        "batch-canvas", "refused",
        "enqueue_many takes no chains, chords or links",
        "chains, chords and ``link``/``link_error`` in ``enqueue_many`` (:ref:`batch-enqueue`;"
        " ``apply_async`` takes them)",
        "Every job of a batch is encoded and checked before the first is sent; callbacks "
        "publish later jobs from the worker, which ``apply_async`` does.",
        met_by='a call of enqueue_many'),
    Difference(
        "failed-jobs", "different",
        "a failed or undeliverable job is dead-lettered with an error code, never acked and "
        "dropped",
        "a failed job is nacked into ``ojs.queue.dlx.{q}``, never acked and lost; a delivery "
        "that is not a runnable OJS job (a type no task handles, a body that is not strict "
        "JSON or not a valid envelope, another content type, such as a plain Celery message "
        "published into ``ojs.queue.{q}``) is dead-lettered with an error code, where Celery "
        "rejects unregistered tasks and acks and drops undecodable messages (:ref:`consuming`)",
        "The binding's FAIL (AMQP-009): nothing is acked and lost, and a dead letter can be "
        "read and replayed.",
        met_by="any task of the app's own"),
    Difference(
        "delays-in-the-broker", "different",
        "retries and countdown/eta jobs wait in the broker, not in a worker's memory",
        "retries and ``countdown``/``eta`` jobs wait in the broker (retry queues, the "
        "scheduling ladder), never in a worker's memory; a retry is a new copy of the job "
        "(same id) that never starts before its delay (:ref:`retries`).  The task still sees "
        "the due time as ``request.eta``",
        "ETA jobs held in a worker's memory exhaust it, starve its prefetch and get its "
        "channel closed by RabbitMQ's ``consumer_timeout``; the broker holds them instead "
        "(AMQP-017, 022).  Rounding to rungs bounds the number of retry queues.",
        met_by="a call's countdown= or eta=, self.retry(), a task's autoretry_for"),
    Difference(
        "reject-and-expires", "different",
        "Reject(requeue=True) is a delayed retry; an expired job is dead-lettered as EXPIRED",
        "``Reject(requeue=True)`` is a failed attempt, retried after a delay while the job's "
        "``max_attempts`` allow and then dead-lettered, never an immediate requeue; a job "
        "whose ``expires`` passed before it started is dead-lettered as ``EXPIRED`` (kept in "
        "the DLQ), not acked as revoked, and stored as Celery's ``REVOKED`` (reason "
        "``expired``) so a caller's ``get()`` raises ``TaskRevokedError`` as on ``amqp://``",
        "The binding forbids immediate requeue loops: a job that fails at once would spin.  "
        "An expired job stays visible (``dlq list``) and can be replayed.",
        met_by="a call's expires=, a task's expires, Reject(requeue=True)"),
    Difference(
        "stated-attempts", "different",
        "x-ojs-attempt can exceed x-ojs-max-attempts when self.retry() retries a task without "
        "autoretry_for",
        "a task without ``autoretry_for`` publishes ``max_attempts: 1`` yet ``self.retry()`` "
        "still retries it, so ``x-ojs-attempt`` can exceed ``x-ojs-max-attempts``; "
        "``ojs_retry_semantics=\"ojs\"`` (opt-in) retries every failure under OJS's policy "
        "and jitter",
        "Under the default ``ojs_retry_semantics=\"celery\"`` only ``autoretry_for`` failures "
        "are retried on their own, as in Celery; the envelope states that policy, and "
        "``self.retry()`` is the task's explicit decision.  ``ojs-kombu migrate check`` shows "
        "both numbers.",
        met_by='a task self.retry() can retry beyond its max_attempts'),
    Difference(
        "queue-layout", "different",
        "job queues are ojs.queue.{q} queues with a dead-letter and a control queue",
        "queues are ``ojs.queue.{q}`` (Celery's ``celery`` is ``default``), classic queues "
        "(priority queues where the app asks, as in Celery: :ref:`priority-queues`), plus a "
        "dead-letter and a control queue each "
        "(:ref:`topology`): plain Celery workers and OJS workers never share a queue; "
        "``inspect active_queues`` shows those",
        "The OJS names (AMQP-031) are what other OJS clients use; separate names are what "
        "makes the rollout and the rollback a dual run.",
        met_by="the queues the app's tasks are routed to"),
    Difference(
        "native-delayed-delivery", "different",
        "Celery's native delayed delivery (celery_delayed_*) is never used",
        "Celery's native delayed delivery for quorum queues (``celery_delayed_*``) is never "
        "used: ``countdown``/``eta`` take the OJS ladder",
        "Celery's mechanism covers quorum queues and topic exchanges only, at 1 s "
        "granularity; the OJS ladder works for every queue type, to the millisecond.",
        met_by=("task_default_queue_type='quorum', a quorum queue in task_queues, a "
                'broker_native_delayed_delivery_* setting')),
    Difference(
        "purge-and-scheduled", "different",
        "celery purge empties ojs.queue.{q} only; inspect scheduled is always empty",
        "``celery purge`` empties ``ojs.queue.{q}`` only (jobs not yet due and retries wait "
        "in other queues), and ``celery inspect scheduled`` is always empty (a worker holds "
        "no ``eta`` job; :ref:`retries`)",
        "Jobs that are not due wait in the broker, not in ``ojs.queue.{q}`` nor in a worker.",
        met_by=('app.control.purge(), inspect().scheduled(), any job not yet due (see '
                'delays-in-the-broker)')),
    Difference(
        "acked-after-run", "different",
        "a running job shows acknowledged: False in inspect active (acked after it ran)",
        "a job is acked after it ran, so ``inspect active`` and ``query_task`` show a running "
        "job with ``acknowledged: False``, and its ``delivery_info`` names "
        "``ojs.exchange.direct`` with the OJS queue as routing key",
        "Acks after the run are the binding's (AMQP-008): a job whose worker dies is "
        "redelivered, never lost.",
        met_by='inspect().active() or query_task(), a read of request.delivery_info'),
    Difference(
        "message-properties", "different",
        "apply_async(app_id=...) and other AMQP properties are not carried",
        "job messages carry the binding's AMQP properties (``app_id`` ``ojs``, "
        "``message_id`` the OJS id, ``type`` the OJS type): ``apply_async(app_id=..., "
        "user_id=..., content_type=...)`` are not carried; headers (``headers=...``) are",
        "Every OJS consumer reads the same properties (AMQP-011, 012); custom values travel "
        "as headers, inside the envelope.",
        met_by=("a call's app_id=, user_id=, content_type= or another AMQP property the binding"
                ' sets')),
    Difference(
        "task-ids", "different",
        "a task_id that is not a UUIDv7 travels beside a new UUIDv7 job id",
        "any ``task_id`` works as in Celery (results, ``revoke``, ``inspect``, events, "
        "Flower); one that is not a lowercase UUIDv7 (``\"report-42\"``, "
        "``str(uuid.uuid4())``) travels as ``x_celery.id`` of a job whose OJS ``id`` "
        "(and ``message_id``, dead letters, OJS events) is a new UUIDv7.  ``ojs-kombu "
        "cancel`` and ``info`` take either; INFO by the OJS id of such a job is answered by "
        "the workers while they remember it (10,000 jobs each), by the task id from the "
        "result backend too (:ref:`job-ids`)",
        "OJS ids are UUIDv7 (the binding's section 6, the job schema); Celery's are any "
        "string.  ``install()`` makes Celery mint UUIDv7s, so a task id and its OJS id are one "
        "unless the caller chose the id.",
        met_by="a call's task_id= that is not a UUIDv7"),
    Difference(
        "typed-values", "different",
        "dates, UUIDs, Decimals and bytes are natural JSON on the wire, typed in "
        "meta.x_celery_types",
        "values Celery's JSON carries as kombu's tagged objects (``datetime``, ``date``, "
        "``time``, ``UUID``, ``Decimal``, ``bytes``, NaN and the infinities, types an app "
        "registers with ``kombu.utils.json.register_type``) arrive as sent, but travel as "
        "ISO 8601, UUID and decimal strings, base64 and strings, with their types in the "
        "envelope's ``meta.x_celery_types`` (:ref:`typed-values`): a consumer that reads "
        "raw messages sees those, not ``{\"__type__\": ...}``",
        "The job schema asks for JSON-native ``args`` with no language-specific "
        "serialization format inside; each value has a natural JSON form every language "
        "reads.",
        met_by=('a task argument annotated as Decimal, datetime, date, time, UUID or bytes; '
                "such a value in a call's arguments; kombu's register_type")),
    Difference(
        "install-defaults", "different",
        "install() sets broker_heartbeat 60 s and the OJS beat scheduler",
        "``install()`` changes two defaults: ``broker_heartbeat`` 60 s (Celery's is 120 s), "
        "and the beat scheduler ``ojs_kombu.celery.beat:OJSScheduler`` when it was Celery's "
        "default",
        "60 s is the binding's recommended heartbeat; the OJS beat scheduler emits "
        "``cron.triggered`` and ``cron.skipped``.",
        met_by=("broker_heartbeat left at Celery's 120 s; a beat_schedule with Celery's default"
                ' scheduler')),
    Difference(
        "batch-signals", "different",
        "enqueue_many sends no publish signals and no task-sent events",
        "``enqueue_many`` sends no ``before_task_publish``/``after_task_publish`` signals and "
        "no ``task-sent`` events per job (the OJS ``job.enqueued`` event is sent)",
        "A batch goes to the channel directly, not through Celery's ``send_task_message``, so "
        "that one call pipelines its confirms.",
        met_by='a call of enqueue_many'),
    Difference(
        "cancel", "different",
        "OJS CANCEL is obeyed by every OJS worker; revoke works as in Celery",
        "OJS CANCEL (``ojs-kombu cancel``, ``ControlClient.cancel``) is obeyed by every OJS "
        "worker; Celery's ``revoke`` still works as in Celery",
        "CANCEL (AMQP-019) is what any OJS client sends; ``revoke`` stays for Celery's own "
        "tools.",
        met_by='nothing: revoke() keeps working; CANCEL is new'),
    Difference(
        "flower-broker-tab", "different",
        "Flower's Broker tab needs an amqp:// URL and --broker_api",
        "Flower's Broker tab needs an ``amqp://`` URL and ``--broker_api`` (:ref:`migrating`)",
        "Flower picks its broker client by the URL's scheme and knows only ``amqp``/"
        "``amqps`` (and Redis).",
        met_by=("an import of flower, flower in the project's requirements, pyproject.toml, "
                'Procfile or compose file')),
)

