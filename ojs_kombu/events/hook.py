"""The one observation hook: where ojs_kombu says "this happened", and who hears it.

A :class:`Hook` has a method per moment (:class:`~ojs_kombu.events.observer.Observer`'s);
calling it calls that method of every registered observer that overrides it,
in registration order.  Which observers override which moment is worked out
when an observer is added or removed, not per call: a moment nobody overrides
is the base class's no-op, and one observer is called without a loop.  An
observer that raises is logged and counted (:attr:`Hook.failures`); the
moment still reaches the observers after it and the caller never sees it.
Only :class:`Exception` is contained: ``KeyboardInterrupt`` and ``SystemExit``
propagate.  Pure code: no I/O.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from .observer import MOMENTS, Observer, overrides

logger = logging.getLogger("ojs_kombu.events")


class Hook(Observer):
    """The observers of one binding (one app in a process); thread-safe.

    Adding and removing swap immutable tuples under a lock, so a moment reads
    its observers without locking, also while another thread adds one.
    """

    def __init__(self, *observers: Observer) -> None:
        self._lock = threading.Lock()
        self._observers: tuple[Observer, ...] = ()
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
        """Whether some observer overrides ``moment`` (so its arguments are worth building)."""
        return moment in self.__dict__

    def _wire(self) -> None:
        for moment in MOMENTS:
            methods = tuple(getattr(o, moment) for o in self._observers if overrides(o, moment))
            if methods:
                setattr(self, moment, self._dispatch(moment, methods))
            else:
                self.__dict__.pop(moment, None)  # the base class's no-op

    def _dispatch(self, moment: str, methods: tuple[Callable[..., Any], ...]
                  ) -> Callable[..., None]:
        if len(methods) == 1:
            (method,) = methods

            def one(*args: Any, **kwargs: Any) -> None:
                try:
                    method(*args, **kwargs)
                except Exception:
                    self._failed(moment, method)
            return one

        def each(*args: Any, **kwargs: Any) -> None:
            for method in methods:
                try:
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
