// The pure parts of ojs.js (no broker): node --test
import assert from 'node:assert/strict';
import { test } from 'node:test';
import {
  CONTENT_TYPE, celeryValue, durationMs, jobProperties, newJobId, reconnectDelayMs,
  retryDelayMs, withCeleryTypes,
} from '../ojs.js';

test('job ids are lowercase UUIDv7 that start with the creation time', () => {
  const now = Date.UTC(2026, 1, 15, 10, 30);
  const id = newJobId(now);
  assert.match(id, /^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
  assert.equal(parseInt(id.replace(/-/g, '').slice(0, 12), 16), now);
  assert.notEqual(newJobId(now), id);
});

test('ISO 8601 durations of retry policies', () => {
  assert.equal(durationMs('PT1S'), 1000);
  assert.equal(durationMs('PT0.2S'), 200);
  assert.equal(durationMs('PT5M'), 300_000);
  assert.equal(durationMs('P1DT1H'), 90_000_000);
  for (const bad of ['P', 'PT', '1S', 'PT-1S', 'five']) assert.throws(() => durationMs(bad), RangeError);
});

test('retry delays: initial * coefficient^(n-1), capped, jitter in [0.5, 1.5)', () => {
  const policy = { initial_interval: 'PT0.2S', max_interval: 'PT1S', jitter: false };
  assert.deepEqual([1, 2, 3, 4].map((n) => retryDelayMs(policy, n)), [200, 400, 800, 1000]);
  assert.equal(retryDelayMs({}, 1, () => 0), 500); // the OJS defaults: PT1S, jittered
  assert.equal(retryDelayMs({}, 1, () => 0.999), 1499);
  assert.equal(retryDelayMs({ max_interval: 'PT1S' }, 1, () => 0.999), 1000); // capped again
});

test('reconnect delays: 1, 2, 4 ... s capped at 60 s, +-25 %, never above the cap', () => {
  assert.deepEqual([1, 2, 3].map((n) => reconnectDelayMs(n, () => 0.5)), [1000, 2000, 4000]);
  assert.equal(reconnectDelayMs(1, () => 0), 750);
  assert.equal(reconnectDelayMs(1, () => 1), 1250);
  assert.equal(reconnectDelayMs(12, () => 1), 60_000);
  assert.equal(reconnectDelayMs(12, () => 0), 45_000);
});

test('message properties and headers of sections 6.1 and 6.2', () => {
  const job = { specversion: '1.0', id: newJobId(), type: 'email.send', queue: 'email', args: [],
    created_at: '2026-02-15T10:30:00.500Z', enqueued_at: '2026-02-15T10:30:01.000Z',
    scheduled_at: '2026-02-15T10:31:00.000Z', priority: 10, retry: { max_attempts: 5 },
    meta: { tags: ['a', 'b'], traceparent: '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01' } };
  const p = jobProperties(job);
  assert.equal(p.messageId, job.id);
  assert.equal(p.type, 'email.send');
  assert.equal(p.contentType, CONTENT_TYPE);
  assert.equal(p.contentEncoding, 'utf-8');
  assert.equal(p.timestamp, Date.UTC(2026, 1, 15, 10, 30) / 1000);
  assert.equal(p.persistent, true);
  assert.equal(p.priority, 9); // AMQP priorities are 0..9
  assert.deepEqual(p.headers['x-ojs-attempt'], { '!': 'int', value: 1 });
  assert.deepEqual(p.headers['x-ojs-max-attempts'], { '!': 'int', value: 5 });
  assert.equal(p.headers['x-ojs-queue'], 'email');
  assert.equal(p.headers['x-ojs-scheduled-at'], job.scheduled_at);
  assert.equal(p.headers['x-ojs-tags'], 'a,b');
  assert.equal(p.headers['x-ojs-trace-id'], job.meta.traceparent);
});

test('typed values for a Celery task: natural JSON, types in x_celery_types', () => {
  const { args, types } = withCeleryTypes([
    celeryValue('date', '2026-07-01'), { order: { id: celeryValue('uuid', '0f8fad5b-d9cb-469f-a165-70867728950e') } },
    [celeryValue('decimal', '19.90')], 42, { 'a/b': celeryValue('time', '09:30:00') },
  ]);
  assert.deepEqual(args, ['2026-07-01', { order: { id: '0f8fad5b-d9cb-469f-a165-70867728950e' } }, ['19.90'], 42,
    { 'a/b': '09:30:00' }]);
  assert.deepEqual(types, { '/args/0': 'date', '/args/1/order/id': 'uuid', '/args/2/0': 'decimal',
    '/args/4/a~1b': 'time' });
  assert.deepEqual(withCeleryTypes([1, 'x']).types, {});
  assert.throws(() => withCeleryTypes([celeryValue('money', '1')]), RangeError);
  assert.throws(() => withCeleryTypes([celeryValue('decimal', 1.5)]), TypeError);
});
