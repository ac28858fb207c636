"""The events part of ``run.py``: publish and drain of ojs_kombu with OJS events (AMQP
sink) and OpenTelemetry metrics off and on, a fresh app per side and round
(``events_scenario.py`` holds the probe, the tap and the table)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import events_scenario
from admin import Broker
from measure import measure_drain, measure_publish, plain, progress, summarize, warm_up
from sides import CONCURRENCY, POOL, WARMUP, Side, make_ojs_side

from ojs_kombu.celery.events import events_exchange


@contextmanager
def events_side(broker: Broker, broker_url: str, kind: str
                ) -> Iterator[tuple[Side, events_scenario.Probe | None]]:
    """A fresh ojs_kombu side of ``kind`` (``events_scenario.SIDES``: off, on, or the AMQP
    sink or the metrics alone) and, with the sink, its probe with a tap queue.

    Fresh per round: an in-process worker's shutdown closes the app's event
    sinks for good (see README), so an app is not reused after its worker ran.
    On exit its connections close and everything it (or the tap) declared is deleted.
    """
    pid = os.getpid()
    prefix = f"bench{pid}-ev{kind}"
    sink, metrics = events_scenario.SIDES[kind]
    conf: dict[str, Any] = {}
    provider = reader = None
    if metrics:
        provider, reader = events_scenario.meter_provider()
        conf["ojs_meter_provider"] = provider
    if sink:
        conf["ojs_event_sinks"] = ["amqp"]
    side = make_ojs_side(broker_url, pid, prefix=prefix, conf=conf,
                         label=f"ojs_kombu events {kind}")
    tap = None
    try:
        probe = None
        if sink:
            exchange = events_exchange(side.app.amqp.binding.names)
            side.exchanges.append(exchange)
            side.queues.append(f"{prefix}-events-tap")
            tap = events_scenario.Tap(broker.connection, exchange, side.queues[-1])
            probe = events_scenario.Probe(side.app, tap, reader)
        yield side, probe
    finally:
        side.app.close()
        if provider is not None:
            provider.shutdown()
        if tap is not None:
            tap.close()
        broker.delete_side(side)


def measure_events_side(broker: Broker, args: argparse.Namespace, kind: str
                        ) -> dict[str, Any]:
    """Warm-up, publish, drain of one side; with the sink, also what the tap received."""
    with events_side(broker, args.broker, kind) as (side, probe):
        warm_up(side, broker)
        if probe is None:
            return {"publish": measure_publish(side, broker, args.jobs),
                    "drain": measure_drain(side, broker, args.drain_jobs, args.timeout)}
        probe.reset(args.timeout)
        published = measure_publish(side, broker, args.jobs)
        publish_events = probe.after_publish(args.jobs, args.timeout)
        job_ids: list[str] = []
        lag: list[float | None] = []
        drained = measure_drain(
            side, broker, args.drain_jobs, args.timeout, job_ids=job_ids,
            before_start=lambda: probe.before_worker(args.timeout),
            when_done=lambda: lag.append(
                probe.wait_drain_events(side.recorder, args.drain_jobs, args.timeout)))
        return {"publish": published, "drain": drained, "publish_events": publish_events,
                "drain_events_lag_s": lag[0] if lag else None,
                "events": probe.collect(job_ids, args.timeout)}


def run_events(broker: Broker, args: argparse.Namespace) -> dict[str, Any]:
    """Events off, on, and (unless ``--no-events-split``) the sink alone and the metrics
    alone; a fresh app per side and round, the order rotated by one side per round."""
    kinds = list(events_scenario.SIDES) if args.events_split else ["off", "on"]
    rounds: list[dict[str, Any]] = []
    for i in range(args.rounds):
        order = events_scenario.rotated(kinds, i)
        got: dict[str, Any] = {"order": order}
        for kind in order:
            progress(f"events: round {i + 1}/{args.rounds}, events {kind} ...")
            got[kind] = measure_events_side(broker, args, kind)
        rounds.append(plain(got))
    result = events_scenario.summarize(rounds, summarize)
    result["settings"] = {"event_sinks": ["amqp"], "metric_reader": "InMemoryMetricReader",
                          "pool": POOL, "concurrency": CONCURRENCY, "warmup": WARMUP,
                          "sides": kinds}
    return result
