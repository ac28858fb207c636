"""``migrate check``: the call sites of an app's own code, read without running it.

The options that meet a difference from plain Celery (``countdown``, ``eta``,
``priority``, ``queue``, ``task_id``, AMQP properties ...) are mostly passed where
a job is sent, not in the app's configuration.  :func:`scan_app` finds the source
files of the app's own modules (the app module's and the task modules' top-level
packages; never a file under ``site-packages``), parses each with :mod:`ast` and
keeps the calls that send, retry or reject a job, with their keyword options and
the values they carry.  Nothing is imported or run, and the scan is bounded
(:data:`MAX_FILES` files of at most :data:`MAX_BYTES` each).
"""

from __future__ import annotations

import ast
import os
import re
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MAX_FILES = 2000
MAX_BYTES = 1_000_000
_SKIP_DIRS = {".git", ".hg", ".tox", ".nox", ".venv", "venv", "env", "node_modules",
              "__pycache__", "site-packages", "dist-packages", "build", "dist"}

#: Calls whose keyword arguments are sending options, and the keywords that are not.
_OPTION_CALLS: dict[str, frozenset[str]] = {
    "apply_async": frozenset({"args", "kwargs", "link", "link_error", "producer", "shadow",
                              "router", "connection", "add_to_parent"}),
    "send_task": frozenset({"name", "args", "kwargs", "producer", "connection", "router",
                            "result_cls", "add_to_parent", "link", "link_error", "shadow"}),
    "retry": frozenset({"args", "kwargs", "exc", "throw", "max_retries"}),
    "set": frozenset(),
    "signature": frozenset({"varies", "args", "kwargs", "options", "type", "subtask_type",
                            "immutable", "app"}),
    "subtask": frozenset({"varies", "args", "kwargs", "options", "type", "subtask_type",
                          "immutable", "app"}),
}
#: Calls whose arguments are the job's arguments.
_VALUE_CALLS = frozenset({"delay", "s", "si", "apply_async", "send_task", "signature",
                          "subtask"})
#: Other calls a difference is about (by their last name).
_OTHER_CALLS = frozenset({"Reject", "enqueue_many", "purge", "scheduled", "active",
                          "query_task", "register_type"})
#: Attributes a difference is about (``request.delivery_info``).
_ATTRIBUTES = frozenset({"delivery_info"})
#: The project's own files that name its dependencies and processes.
PROJECT_FILES = ("requirements*.txt", "requirements/*.txt", "pyproject.toml", "setup.cfg",
                 "setup.py", "Pipfile", "Procfile", "docker-compose*.y*ml", "compose*.y*ml")


@dataclass(frozen=True)
class CallSite:
    """One call in the app's code: ``where`` is ``path:line``."""

    where: str
    name: str
    #: its sending options, by keyword (``options={...}`` entries of ``signature`` too)
    options: dict[str, ast.expr]
    #: the values it gives the job (``args``/``kwargs``, ``delay``'s arguments)
    values: tuple[ast.expr, ...] = ()
    #: the other arguments (``Reject``'s), positional then keyword
    args: tuple[ast.expr, ...] = ()
    keywords: dict[str, ast.expr] = field(default_factory=dict)
    #: what the method is called on, as written (``app.control``), "" for a function
    receiver: str = ""

    def shown(self, option: str) -> str:
        """``where name(option=value)``, the value as written (shortened)."""
        text = ast.unparse(self.options[option]) if option in self.options else "..."
        if len(text) > 40:
            text = text[:37] + "..."
        return f"{self.where} {self.name}({option}={text})"


@dataclass
class AppScan:
    """What :func:`scan_app` found."""

    calls: list[CallSite] = field(default_factory=list)
    #: ``where`` of each use of an attribute in :data:`_ATTRIBUTES`, by name
    attributes: dict[str, list[str]] = field(default_factory=dict)
    #: ``where`` of each ``import flower`` (or ``from flower ...``)
    flower_imports: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    #: the directories scanned (their project files are read too: requirements ...)
    roots: list[Path] = field(default_factory=list)
    truncated: bool = False
    unreadable: list[str] = field(default_factory=list)

    def named(self, *names: str) -> list[CallSite]:
        return [call for call in self.calls if call.name in names]

    def with_option(self, option: str) -> list[CallSite]:
        return [call for call in self.calls if option in call.options]


def literal(node: ast.expr) -> tuple[bool, Any]:
    """``(True, value)`` when ``node`` is a literal (``-5`` and ``60 * 60`` included)."""
    try:
        return True, ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        pass
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mult, ast.Add, ast.Sub)):
        left_ok, left = literal(node.left)
        right_ok, right = literal(node.right)
        if left_ok and right_ok and all(isinstance(v, (int, float)) for v in (left, right)):
            if isinstance(node.op, ast.Mult):
                return True, left * right
            return True, left + right if isinstance(node.op, ast.Add) else left - right
    return False, None


def timedelta_seconds(node: ast.expr) -> float | None:
    """The largest ``timedelta(...)`` of literal arguments in ``node``, in seconds."""
    from datetime import timedelta

    largest = None
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call) and getattr(sub.func, "attr", getattr(
                sub.func, "id", None)) == "timedelta":
            given = {}
            for keyword in sub.keywords:
                known, value = literal(keyword.value)
                if not known or keyword.arg is None:
                    return None
                given[keyword.arg] = value
            positional = [literal(arg) for arg in sub.args]
            if not all(known for known, _ in positional):
                return None
            try:
                seconds = timedelta(*(v for _, v in positional), **given).total_seconds()
            except (TypeError, ValueError, OverflowError):
                return None
            largest = seconds if largest is None else max(largest, seconds)
    return largest


def never_a_uuid(node: ast.expr) -> bool:
    """An f-string whose fixed text has a character no lowercase UUID has."""
    return isinstance(node, ast.JoinedStr) and any(
        isinstance(part, ast.Constant) and set(str(part.value)) - set("0123456789abcdef-")
        for part in node.values)


def _last_name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return None


def _call_site(node: ast.Call, name: str, where: str) -> CallSite:
    keywords = {k.arg: k.value for k in node.keywords if k.arg is not None}
    options: dict[str, ast.expr] = {}
    values: list[ast.expr] = []
    if name in _OPTION_CALLS:
        options = {k: v for k, v in keywords.items() if k not in _OPTION_CALLS[name]}
        inner = keywords.get("options")
        if isinstance(inner, ast.Dict):
            for key, value in zip(inner.keys, inner.values, strict=True):
                if isinstance(key, ast.Constant) and isinstance(key.value, str):
                    options[key.value] = value
    if name in ("delay", "s", "si"):
        values = [*node.args, *keywords.values()]
    elif name in _VALUE_CALLS:  # a task name given first is no value JSON changes
        values = [*node.args, *(keywords[k] for k in ("args", "kwargs") if k in keywords)]
    receiver = ast.unparse(node.func.value) if isinstance(node.func, ast.Attribute) else ""
    return CallSite(where, name, options, tuple(values), tuple(node.args), keywords,
                    receiver)


def scan_source(source: str, where: str) -> AppScan:
    """The call sites of one file's source (``where``: its path as shown)."""
    scan = AppScan(files=[where])
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = _last_name(node.func)
            if name in _OPTION_CALLS or name in _VALUE_CALLS or name in _OTHER_CALLS:
                scan.calls.append(_call_site(node, name, f"{where}:{node.lineno}"))
        elif isinstance(node, ast.Attribute) and node.attr in _ATTRIBUTES:
            scan.attributes.setdefault(node.attr, []).append(f"{where}:{node.lineno}")
        elif isinstance(node, ast.Import):
            if any(alias.name.partition(".")[0] == "flower" for alias in node.names):
                scan.flower_imports.append(f"{where}:{node.lineno}")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (
                (node.module or "").partition(".")[0] == "flower"):
            scan.flower_imports.append(f"{where}:{node.lineno}")
    return scan


def _outside_the_app(path: Path) -> bool:
    """A dependency's file (installed packages, the standard library, ojs_kombu)."""
    parts = set(path.parts)
    if parts & {"site-packages", "dist-packages"}:
        return True
    stdlib = Path(os.__file__).resolve().parent
    return path == stdlib or stdlib in path.parents


def source_roots(module_names: Iterable[str]) -> list[Path]:
    """The files and package directories of the top-level modules of ``module_names``
    (already imported: nothing is imported here)."""
    roots: list[Path] = []
    for top in sorted({name.partition(".")[0] for name in module_names}):
        module = sys.modules.get(top)
        if module is None or top in ("__main__", "ojs_kombu", "celery"):
            continue
        paths = [Path(p) for p in getattr(module, "__path__", None) or ()]
        if not paths and getattr(module, "__file__", None):
            paths = [Path(str(module.__file__))]
        for path in paths:
            resolved = path.resolve()
            if not _outside_the_app(resolved) and resolved not in roots:
                roots.append(resolved)
    return roots


def _files(roots: list[Path]) -> Iterator[Path]:
    for root in roots:
        if root.is_file():
            yield root
            continue
        for directory, subdirs, names in os.walk(root):
            subdirs[:] = sorted(d for d in subdirs if d not in _SKIP_DIRS)
            for name in sorted(names):
                if name.endswith(".py"):
                    yield Path(directory) / name


def scan_app(module_names: Iterable[str]) -> AppScan:
    """The call sites in the source of the app's own modules (see the module's doc)."""
    roots = source_roots(module_names)
    scan = AppScan(roots=roots)
    base = Path.cwd()
    for count, path in enumerate(_files(roots)):
        if count >= MAX_FILES:
            scan.truncated = True
            break
        try:
            shown = str(path.relative_to(base))
        except ValueError:
            shown = str(path)
        try:
            if path.stat().st_size > MAX_BYTES:
                scan.unreadable.append(f"{shown} (over {MAX_BYTES} bytes)")
                continue
            found = scan_source(path.read_text(encoding="utf-8"), shown)
        except (OSError, UnicodeDecodeError, SyntaxError, ValueError) as exc:
            scan.unreadable.append(f"{shown} ({type(exc).__name__})")
            continue
        scan.files.append(shown)
        scan.calls += found.calls
        scan.flower_imports += found.flower_imports
        for name, wheres in found.attributes.items():
            scan.attributes.setdefault(name, []).extend(wheres)
    return scan


def app_modules(app: Any, task_modules: Iterable[str]) -> list[str]:
    """The modules that hold ``app`` (as a global) and define its own tasks."""
    names = set(task_modules)
    for name, module in list(sys.modules.items()):
        namespace = getattr(module, "__dict__", None)
        if namespace is not None and any(value is app for value in list(namespace.values())):
            names.add(name)
    for task_name, task in list(app.tasks.items()):
        if not task_name.startswith("celery."):
            run = getattr(task, "run", None)
            names.add(getattr(run, "__module__", None) or type(task).__module__)
    return sorted(n for n in names if n)


def project_mentions(roots: Iterable[Path], word: str) -> list[str]:
    """``file:line`` of the first line naming ``word`` (a dependency, a process) in each
    project file (:data:`PROJECT_FILES`) in the scanned packages and beside them."""
    found: list[str] = []
    seen: set[Path] = set()
    for root in roots:
        for directory in (root, root.parent) if root.is_dir() else (root.parent,):
            if directory in seen:
                continue
            seen.add(directory)
            for pattern in PROJECT_FILES:
                for path in sorted(directory.glob(pattern))[:20]:
                    found += _mentions(path, word)
    return found


def _mentions(path: Path, word: str) -> list[str]:
    try:
        if path.stat().st_size > MAX_BYTES:
            return []
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []
    for number, line in enumerate(lines, 1):
        if line.lstrip().startswith("#"):
            continue
        for token in re.split(r"[\s\"':,;]+", line):
            if re.split(r"[<>=~!\[]", token.lower())[0] == word:
                return [f"{path.parent.name}/{path.name}:{number} {word}"]
    return []


def calls_self_retry(task: Any) -> bool:
    """Whether the source of ``task``'s ``run`` calls ``<something>.retry(...)`` (read with
    :mod:`inspect`, from the module already imported; unreadable source: ``False``)."""
    import inspect
    import textwrap

    run = getattr(task, "run", None)
    try:
        source = textwrap.dedent(inspect.getsource(run))  # type: ignore[arg-type]
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError, ValueError):
        return False
    return any(isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
               and node.func.attr == "retry" for node in ast.walk(tree))
