"""The pure floor: what an OJS job is, with no I/O.

The job envelope and its names, Celery <-> OJS encoding and decoding, retry
policies and the one failure decision, time format and backoff, backpressure
arguments and the ``ojs_*`` settings as data.  Modules here import only the standard library,
pydantic, orjson, uuid-utils and each other: no kombu, no py-amqp, no Celery,
no sockets, no clocks that sleep.  Everything above may import it.
"""
