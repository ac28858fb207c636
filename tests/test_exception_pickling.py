"""Every exception ojs_kombu defines survives the prefork pool.

Celery's prefork pool pickles what a task raised to the worker's main process,
also inside ``Reject`` (Celery's ``Task.retry`` wraps a publish that failed in
it) and ``Retry``.  An exception that cannot be unpickled there stops the worker
consuming, so every class is found here by walking the package (none listed by
hand), built with arguments its ``__init__`` names, and sent through pickle.
"""

from __future__ import annotations

import importlib
import inspect
import pickle
import pkgutil
import traceback
from collections.abc import Iterator
from typing import Any

import pytest
from billiard.einfo import ExceptionWithTraceback
from celery.exceptions import Reject, Retry

import ojs_kombu
from ojs_kombu.spec.errors import JobPublishError


def _modules() -> Iterator[Any]:
    yield ojs_kombu
    for info in pkgutil.walk_packages(ojs_kombu.__path__, "ojs_kombu."):
        yield importlib.import_module(info.name)


def _exception_classes() -> list[type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for module in _modules():
        for _, value in vars(module).items():
            if inspect.isclass(value) and issubclass(value, BaseException) \
                    and value.__module__.startswith("ojs_kombu"):
                found[f"{value.__module__}.{value.__qualname__}"] = value
    return [found[name] for name in sorted(found)]


CLASSES = _exception_classes()


def _sample(name: str, annotation: Any) -> Any:
    """A representative value for a parameter, from its annotation (a string under
    ``from __future__ import annotations``) and its name."""
    text = annotation if isinstance(annotation, str) else repr(annotation)
    text = text.replace("typing.", "").replace("collections.abc.", "")
    if "JobPublishError" in text:
        return (JobPublishError("first job refused", job_id="j-1", queue="email"),)
    if "Path" in text:
        return ("args", 0)
    if text.startswith(("dict", "Mapping", "Mapping[")):
        return {f"{name}-key": f"{name}-value"}
    if text.startswith("list"):
        return [{"loc": ("field",), "msg": f"{name} is wrong", "type": "value_error"}]
    if text.startswith("tuple"):
        return (f"{name}-1", f"{name}-2")
    if text.startswith("bool"):
        return True
    if text.startswith("int"):
        return 7
    if text.startswith("float"):
        return 2.5
    if text in ("Any", "typing.Any"):
        return {f"{name}": [1, "two"]}
    return f"{name}-value"


def _build(cls: type[BaseException]) -> BaseException:
    init = cls.__init__
    if init in (BaseException.__init__, Exception.__init__) or \
            init.__qualname__.split(".")[0] in ("BaseException", "Exception"):
        return cls(f"{cls.__name__} says why")
    kwargs: dict[str, Any] = {}
    args: list[Any] = []
    for param in list(inspect.signature(init).parameters.values())[1:]:
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        value = _sample(param.name, param.annotation)
        if param.kind is param.KEYWORD_ONLY:
            kwargs[param.name] = value
        else:
            args.append(value)
    return cls(*args, **kwargs)


def _state(exc: BaseException) -> dict[str, Any]:
    return {k: (repr(v) if isinstance(v, BaseException) or
                (isinstance(v, tuple) and v and isinstance(v[0], BaseException)) else v)
            for k, v in vars(exc).items()}


def _state_without_traceback(exc: BaseException) -> dict[str, Any]:
    return {k: v for k, v in _state(exc).items() if k != "__cause__"}


def test_the_walk_finds_the_exception_tree() -> None:
    names = {cls.__name__ for cls in CLASSES}
    # The leaves of the tree that broke a worker, and one class of each floor.
    assert {"TopologyPermissionError", "JobRejected", "UnencodableValue", "CLIError",
            "JobCancelled", "BatchQueueFullNacked"} <= names
    assert len(CLASSES) >= 40


@pytest.mark.parametrize("cls", CLASSES, ids=lambda cls: cls.__name__)
def test_every_exception_survives_pickling(cls: type[BaseException]) -> None:
    exc = _build(cls)
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is cls
    assert str(back) == str(exc)
    assert back.args == exc.args
    assert _state(back) == _state(exc)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda cls: cls.__name__)
def test_every_exception_survives_the_pool_inside_reject_and_retry(
        cls: type[BaseException]) -> None:
    exc = _build(cls)
    rejected = pickle.loads(pickle.dumps(Reject(exc, requeue=False)))
    assert type(rejected.reason) is cls and str(rejected.reason) == str(exc)
    assert _state(rejected.reason) == _state(exc)
    retry = pickle.loads(pickle.dumps(Retry("retry", exc=exc, when=3)))
    assert type(retry.exc) is cls and str(retry.exc) == str(exc)
    assert _state(retry.exc) == _state(exc)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda cls: cls.__name__)
def test_every_exception_survives_the_pools_report_with_its_traceback(
        cls: type[BaseException]) -> None:
    """What a prefork pool sends the main process: the exception and its traceback."""
    exc = _build(cls)
    try:
        raise exc
    except BaseException as raised:
        report = ExceptionWithTraceback(raised, "".join(traceback.format_tb(raised.__traceback__)))
    back = pickle.loads(pickle.dumps(report))
    assert type(back) is cls
    assert str(back) == str(exc) and _state_without_traceback(back) == _state(exc)
    assert "raise exc" in back.__cause__.tb
