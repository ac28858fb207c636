"""The Celery floor: what makes a Celery app publish and run OJS jobs.

``install()``, the task class and its request, signals and bootsteps, remote
control (CANCEL, BEAT, INFO), beat, the worker's events and reconnections, and
the publish path of ``apply_async``/``send_task``/``enqueue_many``.  Modules here
may import every lower floor (:mod:`ojs_kombu.amqp`, :mod:`ojs_kombu.events`,
:mod:`ojs_kombu.spec`) and Celery; only :mod:`ojs_kombu.cli` imports them.
"""
