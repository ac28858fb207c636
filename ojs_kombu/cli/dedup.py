"""``ojs-kombu dedup show|clear``: see and clear one record of the dedup store.

A completed idempotency key makes every later delivery of that key an acked
duplicate for ``ojs_dedup_retention``, and a unique record blocks new jobs of
its fingerprint for the policy's ``period``: the way out of both, when a team
knows better than the store, is to look at the record and delete it.  The
store is the app's ``ojs_dedup_url`` (``-A``), ``$OJS_DEDUP_URL`` or
``--dedup-url``; names are under the app's ``ojs_prefix`` (``--prefix``), as
the workers write them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click

from ..celery.dedup_store import DedupStore
from ..spec.errors import DedupNotConfigured, DedupUnavailable
from .common import (
    EXIT_FAILED,
    EXIT_NOT_FOUND,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    CLIError,
    OJSGroup,
    common_options,
    emit,
    options,
)

KINDS = {"key": "idempotency key", "unique": "unique fingerprint"}
#: The record's fields as Redis holds them (one letter each: 150 bytes a key) and as shown.
FIELDS = {"s": "state", "j": "job_id", "a": "attempt", "q": "queue", "t": "scheduled_at",
          "c": "checked_states"}

kind_argument = click.argument("kind", type=click.Choice(list(KINDS)), metavar="KIND")
name_argument = click.argument("name", metavar="NAME")
url_option = click.option(
    "--dedup-url", metavar="URL", default=None,
    help="The dedup store (redis://...); else $OJS_DEDUP_URL, else the app's ojs_dedup_url.")


@click.group(cls=OJSGroup)
def dedup() -> None:
    """See and clear idempotency keys and unique records (ojs_dedup_url).

    KIND is `key` (an idempotency key: a job's x-ojs-idempotency-key) or
    `unique` (the fingerprint of a unique policy).
    """


@contextmanager
def open_store(ctx: click.Context, url: str | None) -> Iterator[DedupStore]:
    """The store the app's workers use; exit 2 without one, 3 when it does not answer."""
    settings = options(ctx).binding().settings
    url = url or os.environ.get("OJS_DEDUP_URL") or settings.dedup_url
    if not url:
        raise DedupNotConfigured(
            "no dedup store: give --dedup-url redis://host:6379/0, set $OJS_DEDUP_URL, or "
            "-A an app with ojs_dedup_url")
    try:
        store = DedupStore(url, settings.dedup_retention, settings.prefix)
    except ValueError as exc:  # redis-py's word on a URL it cannot read
        raise CLIError(f"invalid dedup store URL {url!r}: {exc}", EXIT_USAGE,
                       "invalid_input") from None
    try:
        yield store
    except DedupUnavailable as exc:
        raise CLIError(str(exc), EXIT_UNREACHABLE, "unreachable") from None
    finally:
        store.close()


def _missing(kind: str, name: str, redis_key: str) -> CLIError:
    return CLIError(f"no {KINDS[kind]} {name!r} in the dedup store ({redis_key})",
                    EXIT_NOT_FOUND, "not_found")


@dedup.command()
@kind_argument
@name_argument
@url_option
@common_options
@click.pass_context
def show(ctx: click.Context, kind: str, name: str, dedup_url: str | None) -> None:
    """Show the record of NAME with its remaining lifetime (exit 4 if there is none)."""
    with open_store(ctx, dedup_url) as store:
        record = store.show(kind, name)
        redis_key = store.record_key(kind, name)
    if record is None:
        raise _missing(kind, name, redis_key)
    fields = {FIELDS.get(field, field): value for field, value in record.items()}
    data: dict[str, Any] = {"kind": kind, "name": name, "redis_key": redis_key, **fields}

    def human() -> None:
        click.echo(f"{KINDS[kind]} {name} ({redis_key})")
        for field, value in fields.items():
            click.echo(f"  {field}: {value}")

    emit(ctx, data, human)


@dedup.command()
@kind_argument
@name_argument
@url_option
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.option("--force", is_flag=True,
              help="Also clear a key a running job holds (its next delivery may run beside it).")
@common_options
@click.pass_context
def clear(ctx: click.Context, kind: str, name: str, dedup_url: str | None, yes: bool,
          force: bool) -> None:
    """Delete the record of NAME: a completed key runs again on its next delivery, a
    fingerprint stops blocking new jobs.

    Asks first (unless --yes), showing the record.  A key in state `running`
    guards a job in progress: clearing it lets a duplicate run beside it, so it
    is refused (exit 1) without --force.  Only the record shown is deleted: one
    another job took over meanwhile stays (exit 1).  Exit 4 if there is none.
    """
    with open_store(ctx, dedup_url) as store:
        redis_key = store.record_key(kind, name)
        record = store.show(kind, name)
        if record is None:
            raise _missing(kind, name, redis_key)
        state, holder = record.get("s", "?"), record.get("j", "?")
        if kind == "key" and state == "running" and not force:
            raise CLIError(f"idempotency key {name!r} is held by running job {holder}: "
                           "clearing it lets its next delivery run beside it; wait for the "
                           "job to end, or give --force", EXIT_FAILED, "refused")
        if not yes:
            click.confirm(f"Delete {KINDS[kind]} {name!r} ({redis_key}, {state}, job "
                          f"{holder})?", abort=True, err=True)
        if not store.clear(kind, name, held_by=holder):
            raise CLIError(f"{KINDS[kind]} {name!r} changed since it was read (another job "
                           "holds it now, or it expired): nothing deleted", EXIT_FAILED,
                           "changed")
    emit(ctx, {"kind": kind, "name": name, "redis_key": redis_key, "deleted": True,
               "state": state, "job_id": holder},
         f"deleted {KINDS[kind]} {name} ({redis_key}, {state}, job {holder})")
