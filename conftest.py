"""How pytest-xdist runs the suites in parallel (setup.cfg: ``-n auto``), and how
the suites' ``rabbitmqctl`` runs spend the CPU.

docs/development.rst, "Tests in parallel", says why.  Two hooks: how many xdist
workers ``-n auto`` starts, and which tests go to one worker together.
"""

from __future__ import annotations

import ast
import os
from functools import cache
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent

#: ``-n auto``'s workers per core.  An integration test spends most of its time
#: waiting on RabbitMQ, on Celery workers and on the jobs' own delays, not
#: computing: two workers per core keep the cores busy.
WORKERS_PER_CORE = 2


#: Erlang flags for every ``rabbitmqctl`` the suites run (RabbitMQ's CLI tools read
#: ``RABBITMQ_CTL_ERL_ARGS``; a value already in the environment is kept), the ones
#: RabbitMQ gives its server.  A CLI run boots an Erlang VM for under a second, whose
#: idle schedulers spin by default before they sleep: run alone on an idle machine, a
#: ``list_queues`` costs a sixth to a fifth less CPU without the spinning; inside a
#: loaded suite, where schedulers find little idle time, the saving is within what the
#: load moves (docs/development.rst has both figures).
CTL_ERL_ARGS = "+sbwt none +sbwtdcpu none +sbwtdio none"
os.environ.setdefault("RABBITMQ_CTL_ERL_ARGS", CTL_ERL_ARGS)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """Twice the cores this process may use (at least 2), or ``OJS_TEST_WORKERS``."""
    configured = os.environ.get("OJS_TEST_WORKERS")
    if configured:
        return int(configured)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(2, WORKERS_PER_CORE * (cores or 1))


@cache
def spread(path: str) -> bool:
    """Whether the tests of the module at ``path`` (relative to the root) may go to
    different xdist workers: the unit tests' yes; an integration or fault module's only
    when it says so with ``XDIST_SPREAD = True`` at its top level.

    The xdist controller sees test ids only, not the modules' markers, so the module is
    read here, not imported."""
    if not path.startswith("integration/") and not path.startswith("faults/"):
        return True
    try:
        tree = ast.parse((ROOT / path).read_text())
    except (OSError, SyntaxError):
        return False
    return any(isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
               and node.value.value is True
               and any(isinstance(t, ast.Name) and t.id == "XDIST_SPREAD" for t in node.targets)
               for node in tree.body)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Hand out whole modules, and the tests of a spread module one by one, in the
    collection's order (integration/conftest.py orders it: see its
    ``pytest_collection_modifyitems``).

    A module runs on one xdist worker, in order, its module fixtures (a worker
    subprocess, a TLS node of its own) set up once; each xdist worker is a test session
    with its own private vhost (integration/conftest.py)."""
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):  # type: ignore[misc]  # xdist has no hints here
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return nodeid if spread(path) else path

    config.option.loadscopereorder = False  # the collection's order, not the biggest first
    return ModuleScheduling(config, log)
