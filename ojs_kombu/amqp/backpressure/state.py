"""What the batch admission reads of a producer's backpressure, typed once.

:class:`~ojs_kombu.amqp.backpressure.monitor.BackpressureMonitor` keeps a
:class:`QueueState` per bounded queue and hands itself to the batch rules of
:mod:`~ojs_kombu.amqp.backpressure.admission`, which type it as :class:`Monitor`
so that the two modules do not import each other.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from ...spec.backpressure import Bounds, ProducerBackpressure
from ...spec.errors import JobNackedError
from .circuit_breaker import CircuitBreaker

#: Reads a queue's depth from the broker (``None``: unknown).
DepthReader = Callable[[str], "int | None"]


class QueueState:
    """What a producer knows of one bounded queue: its breaker, the rejections in a
    row (they set ``retry_after``), and the last pressure sampled."""

    __slots__ = ("breaker", "consecutive", "last_sample", "pressure", "warned")

    def __init__(self, breaker: CircuitBreaker | None) -> None:
        self.breaker = breaker
        self.consecutive = 0
        self.last_sample = float("-inf")
        self.pressure: float | None = None
        self.warned = False


class Monitor(Protocol):
    """The members of the monitor that the batch admission uses."""

    settings: ProducerBackpressure
    bounds_for: Callable[[str], Bounds]
    clock: Callable[[], float]
    sleep: Callable[[float], None]

    def emit(self, event_type: str, queue: str, **data: Any) -> None: ...

    def refused(self, queue: str, count: int) -> None: ...

    def queue_state(self, queue: str) -> QueueState: ...

    def retry_after(self, queue: str) -> float: ...

    def sample(self, queue: str, bounds: Bounds, state: QueueState,
               read_depth: DepthReader | None) -> None: ...

    def depth(self, read_depth: DepthReader | None, queue: str) -> int | None: ...

    def nack_error(self, queue: str, job_id: str, read_depth: DepthReader | None = None
                   ) -> JobNackedError: ...
