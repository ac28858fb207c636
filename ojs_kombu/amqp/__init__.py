"""The AMQP floor: the OJS AMQP binding spoken over kombu and py-amqp.

The kombu transport (a thin subclass of kombu's py-amqp transport), publishing
with confirms, receiving and settling deliveries, outcome publishes, topology
declarations, reconnection, and the control and dead-letter clients.  Modules
here may import :mod:`ojs_kombu.spec`, :mod:`ojs_kombu.events`, kombu and
py-amqp, never Celery: an OJS service with no Celery in it could run on this
floor alone.
"""
