"""What a seam module records of each private member of a dependency it uses.

ojs_kombu reaches into a few private members of py-amqp, kombu, Celery and the
OpenTelemetry API, for speed or where no public hook exists.  Every such use
lives in one seam module per library (:mod:`ojs_kombu.amqp.wire.py_amqp_seam`,
:mod:`ojs_kombu.amqp.wire.kombu_seam`, :mod:`ojs_kombu.events.otel_seam`,
:mod:`ojs_kombu.celery.celery_seam`), each listing its hooks as :class:`Hook`
objects.  ``tests/test_seams.py`` pins every hook against the installed
library; at run time a missing or changed hook either switches its feature
off (:attr:`Hook.fallback`, one warning) or refuses to start with
:class:`~ojs_kombu.spec.errors.UnsupportedDependencyError`, never failing
inside the worker's event loop.

This module only inspects the objects it is given: it imports no dependency.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from .errors import UnsupportedDependencyError

logger = logging.getLogger("ojs_kombu.seams")


@dataclass(frozen=True)
class Hook:
    """One private member of a dependency that ojs_kombu uses.

    ``owner`` is the class or module it belongs to and ``member`` its name; a
    callable member must accept ``params`` (names, in order, after ``self``),
    and ``probe`` (when given) checks what a signature cannot (an instance
    attribute, a behaviour) and returns ``True`` when the hook holds.
    ``fallback`` names the feature turned off when it does not; ``None``: the
    package refuses to start.
    """

    library: str
    distribution: str
    owner: Any
    member: str
    why: str
    checked: str
    params: tuple[str, ...] | None = None
    probe: Callable[[], bool] | None = field(default=None, compare=False)
    fallback: str | None = None

    @property
    def name(self) -> str:
        owner = getattr(self.owner, "__qualname__", None) or getattr(self.owner, "__name__", "?")
        module = getattr(self.owner, "__module__", None)
        return f"{module}.{owner}.{self.member}" if module else f"{owner}.{self.member}"

    def problem(self) -> str | None:
        """Why the hook does not hold on the installed library (``None``: it holds)."""
        if self.params is not None:
            member = inspect.getattr_static(self.owner, self.member, None)
            if member is None:
                return "is missing"
            function: Any = member.fget if isinstance(member, property) else member
            function = getattr(function, "__func__", function)
            try:
                parameters = tuple(inspect.signature(function).parameters)
            except (TypeError, ValueError):
                return "has no signature to check"
            if parameters[:1] == ("self",):
                parameters = parameters[1:]
            if parameters[:len(self.params)] != self.params:
                return f"takes ({', '.join(parameters)}), expected ({', '.join(self.params)})"
        if self.probe is not None:
            try:
                if not self.probe():
                    return "does not behave as checked"
            except Exception as exc:  # a probe that raises is a hook that changed
                return f"does not behave as checked ({type(exc).__name__}: {exc})"
        return None

    def describe(self, problem: str) -> str:
        return (f"{self.library} {installed(self.distribution)}: {self.name} {problem} "
                f"(ojs_kombu uses it for {self.why}; checked with {self.library} "
                f"{self.checked})")


def source_uses(owner: Any, *names: str) -> Callable[[], bool]:
    """A probe: ``owner``'s source still says each of ``names`` (for instance attributes,
    which no signature shows)."""
    def probe() -> bool:
        source = inspect.getsource(owner)
        return all(name in source for name in names)
    return probe


def installed(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "(not installed)"


def verify(hooks: Iterable[Hook]) -> frozenset[str]:
    """Check ``hooks``; returns the fallbacks to use, each warned about once.

    Raises :class:`UnsupportedDependencyError` naming every hook without a
    fallback that does not hold.
    """
    fallbacks: set[str] = set()
    fatal: list[str] = []
    for hook in hooks:
        problem = hook.problem()
        if problem is None:
            continue
        if hook.fallback is None:
            fatal.append(hook.describe(problem))
        elif hook.fallback not in fallbacks:
            fallbacks.add(hook.fallback)
            logger.warning("%s: %s", hook.describe(problem), hook.fallback)
    if fatal:
        raise UnsupportedDependencyError(
            "ojs_kombu cannot run on the installed libraries (see the support table in the "
            "README): " + "; ".join(fatal))
    return frozenset(fallbacks)
