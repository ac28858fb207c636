"""The one observation hook: where ojs_kombu says "this happened", and who hears it.

A :class:`Hook` has a method per moment (:class:`~ojs_kombu.events.observer.Observer`'s);
calling it calls that method of every registered observer that overrides it
and is awake (:meth:`~ojs_kombu.events.observer.Observer.awake`), in
registration order.  Which observers override which moment is worked out
when an observer is added or removed, not per call: a moment nobody overrides
is the base class's no-op, and one observer that is always awake is called
without a loop.  An observer that raises is logged and counted
(:attr:`Hook.failures`); the moment still reaches the observers after it and
the caller never sees it.
Only :class:`Exception` is contained: ``KeyboardInterrupt`` and ``SystemExit``
propagate.  Pure code: no I/O.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from .observer import MOMENTS, Observer, overrides, sleeps_at_times

logger = logging.getLogger("ojs_kombu.events")


class Hook(Observer):
    """The observers of one binding (one app in a process); thread-safe.

    Adding and removing swap immutable tuples under a lock, so a moment reads
    its observers without locking, also while another thread adds one.
    """

    def __init__(self, *observers: Observer) -> None:
        self._lock = threading.Lock()
        self._observers: tuple[Observer, ...] = ()
        #: Per moment: the ``awake`` of each of its observers, or ``None`` when one of
        #: them is always awake; a moment nobody observes is not in it.
        self._awake: dict[str, tuple[Callable[[], bool], ...] | None] = {}
        #: How many observer calls raised, over the hook's lifetime.
        self.failures = 0
        for observer in observers:
            self.add(observer)

    @property
    def observers(self) -> tuple[Observer, ...]:
        return self._observers

    def add(self, observer: Observer) -> Observer:
        """Call ``observer`` at every moment it overrides, after the observers added before."""
        if not isinstance(observer, Observer):
            raise TypeError(f"an observer subclasses ojs_kombu.events.observer.Observer, "
                            f"got {observer!r}")
        with self._lock:
            self._observers = (*self._observers, observer)
            self._wire()
        return observer

    def remove(self, observer: Observer) -> None:
        """Stop calling ``observer`` (idempotent)."""
        with self._lock:
            self._observers = tuple(o for o in self._observers if o is not observer)
            self._wire()

    def observes(self, moment: str) -> bool:
        """Whether some observer overrides ``moment`` (awake or not)."""
        return moment in self.__dict__

    def listens(self, moment: str) -> bool:
        """Whether some observer of ``moment`` is awake now (:meth:`Observer.awake`), so
        that its arguments are worth building: with no event subscriber and no metrics
        SDK, a job's moments cost the worker nothing."""
        checks = self._awake.get(moment, ())
        if checks is None:
            return True
        for check in checks:  # noqa: SIM110  (a loop: no generator made per job)
            if check():
                return True
        return False

    def _wire(self) -> None:
        listening: dict[str, tuple[Callable[[], bool], ...] | None] = {}
        for moment in MOMENTS:
            pairs = tuple((getattr(o, moment), o.awake if sleeps_at_times(o) else None)
                          for o in self._observers if overrides(o, moment))
            if pairs:
                setattr(self, moment, self._dispatch(moment, pairs))
                checks = tuple(check for _, check in pairs if check is not None)
                listening[moment] = checks if len(checks) == len(pairs) else None
            else:
                self.__dict__.pop(moment, None)  # the base class's no-op
        self._awake = listening

    def _dispatch(self, moment: str,
                  pairs: tuple[tuple[Callable[..., Any], Callable[[], bool] | None], ...]
                  ) -> Callable[..., None]:
        if len(pairs) == 1 and pairs[0][1] is None:  # one observer, always awake
            ((method, _),) = pairs

            def one(*args: Any, **kwargs: Any) -> None:
                try:
                    method(*args, **kwargs)
                except Exception:
                    self._failed(moment, method)
            return one

        def each(*args: Any, **kwargs: Any) -> None:
            for method, awake in pairs:
                try:
                    if awake is None or awake():
                        method(*args, **kwargs)
                except Exception:
                    self._failed(moment, method)
        return each

    def _failed(self, moment: str, method: Callable[..., Any]) -> None:
        with self._lock:
            self.failures += 1
        logger.exception("observer %r failed at %s", getattr(method, "__self__", method), moment)

    def __repr__(self) -> str:
        return f"<Hook {len(self._observers)} observer(s)>"
