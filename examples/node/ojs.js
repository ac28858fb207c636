// The parts of the OJS AMQP 0-9-1 binding (1.0.0-rc.1) that a producer and a
// worker share: entity names (section 4.1), topology (sections 4, 7, 8.2),
// message properties and headers (section 6), job ids, retry delays.
// Written from the binding and the OJS core documents only; amqplib is the
// AMQP client.
import { randomBytes } from 'node:crypto';
import amqp from 'amqplib';

export const CONTENT_TYPE = 'application/openjobspec+json';
export const DIRECT = 'ojs.exchange.direct';
export const DLX = 'ojs.exchange.dlx';
export const RETRY = 'ojs.exchange.retry';
// Not in the binding: the events spec names no AMQP transport.  ojs_kombu
// publishes events to this topic exchange, routing key = the event type.
export const EVENTS = 'ojs.exchange.events';
export const jobQueue = (q) => `ojs.queue.${q}`;
export const deadLetterQueue = (q) => `ojs.queue.dlx.${q}`;
export const controlQueue = (q) => `ojs.queue.control.${q}`;
// Section 8.1: one queue per delay value, routing key "{queue}.{delay_ms}".
export const delayQueue = (q, ms) => `ojs.queue.retry.${q}.${ms}`;
export const delayKey = (q, ms) => `${q}.${ms}`;

// Control message types.  The binding names cancel (5.6) and heartbeat (5.7) but
// no type for an INFO request (5.8); ojs_kombu's workers read ojs.control.info.
export const CONTROL = { cancel: 'ojs.control.cancel', info: 'ojs.control.info',
  heartbeat: 'ojs.control.heartbeat' };

// Section 11.3: reconnect after 1, 2, 4 ... s, capped at 60 s, each +-25 %
// (and never above the cap).
export function reconnectDelayMs(attempt, random = Math.random) {
  const base = Math.min(2 ** (attempt - 1), 60) * 1000;
  return Math.round(Math.min(base * (0.75 + random() / 2), 60_000));
}

// AMQP heartbeats every 60 s (section 11.1) are this client's BEAT (AMQP-020).
// With `setup`, amqplib reconnects on its own with the delays above and calls
// setup(connection) after every (re)connection, which must declare the topology
// again and register the consumers again (AMQP-025, AMQP-026).
export function connect(url = process.env.OJS_AMQP_URL ?? 'amqp://guest:guest@localhost:5672', setup) {
  const recovery = setup && { setup, calculateDelay: reconnectDelayMs, maxRetries: Infinity };
  return amqp.connect(url, { heartbeat: 60, ...(recovery && { recovery }) });
}

// A UUIDv7 (RFC 9562): 48 bits of Unix milliseconds, version 7, variant 10.
export function newJobId(now = Date.now()) {
  const bytes = randomBytes(16);
  bytes.writeUIntBE(now, 0, 6);
  bytes[6] = (bytes[6] & 0x0f) | 0x70;
  bytes[8] = (bytes[8] & 0x3f) | 0x80;
  const hex = bytes.toString('hex');
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}

export const isoNow = (ms = Date.now()) => new Date(ms).toISOString();

// Values a Celery task should receive as Python types (a date, a UUID, a Decimal ...):
// each travels in its natural JSON form (an ISO 8601, UUID or decimal string, base64),
// and its type in meta.x_celery_types, keyed by a JSON Pointer into the envelope
// (docs/polyglot.rst).  Mark a value { $celery: 'date', value: '2026-07-01' }, in code or
// in the producer's JSON arguments; CELERY_TYPES are the names a worker reads.
export const CELERY_TYPES = ['datetime', 'date', 'time', 'uuid', 'decimal', 'bytes', 'float'];
export const celeryValue = (type, value) => ({ $celery: type, value });

// { args, types }: the arguments with each marked value replaced by its JSON form, and
// the x_celery_types entries for them.
export function withCeleryTypes(args, root = '/args') {
  const types = {};
  const walk = (value, pointer) => {
    if (Array.isArray(value)) return value.map((item, i) => walk(item, `${pointer}/${i}`));
    if (value === null || typeof value !== 'object') return value;
    if (Object.hasOwn(value, '$celery')) {
      if (!CELERY_TYPES.includes(value.$celery)) throw new RangeError(`unknown Celery type ${value.$celery}`);
      if (typeof value.value !== 'string') throw new TypeError(`a ${value.$celery} travels as a string`);
      types[pointer] = value.$celery;
      return value.value;
    }
    const escape = (key) => key.replace(/~/g, '~0').replace(/\//g, '~1');
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, walk(v, `${pointer}/${escape(k)}`)]));
  };
  return { args: walk(args, root), types };
}

// Section 6.2 types x-ojs-attempt and x-ojs-max-attempts as int32; amqplib would
// pick the smallest integer type, so name it.
export const int32 = (value) => ({ '!': 'int', value });

// Declarations are idempotent, but RabbitMQ closes the channel with 406 when an
// entity exists with other arguments (section 10.1): declare on a channel of
// its own, and accept an existing entity as it is (another implementation may
// add arguments the binding allows, such as x-expires or x-queue-type).
async function tolerant(conn, declare) {
  const ch = await conn.createChannel();
  ch.on('error', () => {});
  try {
    await declare(ch);
    await ch.close();
    return true;
  } catch (err) {
    if (err.code !== 406) throw err;
    console.error(`ojs: ${err.message.split(';')[0]}: using it as declared`);
    return false;
  }
}

// Sections 4.2 and 7: both exchanges, the job queue with its dead-lettering
// (AMQP-001..004; x-max-priority 10 as in the binding's example 15.1), the dead
// letter queue and the control queue (bound with its own name, section 5.6).
export async function declareQueue(conn, q) {
  await tolerant(conn, async (ch) => {
    await ch.assertExchange(DIRECT, 'direct', { durable: true });
    await ch.assertExchange(DLX, 'direct', { durable: true });
  });
  await tolerant(conn, (ch) => ch.assertQueue(jobQueue(q), { durable: true, arguments: {
    'x-dead-letter-exchange': DLX, 'x-dead-letter-routing-key': q, 'x-max-priority': 10 } }));
  await tolerant(conn, (ch) => ch.assertQueue(deadLetterQueue(q), { durable: true }));
  await tolerant(conn, (ch) => ch.assertQueue(controlQueue(q), { durable: true }));
  await tolerant(conn, async (ch) => {
    await ch.bindQueue(jobQueue(q), DIRECT, q);
    await ch.bindQueue(deadLetterQueue(q), DLX, q);
    await ch.bindQueue(controlQueue(q), DIRECT, controlQueue(q));
  });
}

// Section 8.2 (and 9.1.1 for scheduled jobs): a queue whose messages wait
// delay_ms, then go back to ojs.exchange.direct with the job queue's name.
// x-expires removes it an hour after its last use (not in 8.2's table, which
// lists what a delay queue must have; without it every distinct delay would
// leave a queue behind).
const declaredDelays = new WeakMap(); // per connection: a new one declares again
export async function declareDelayQueue(conn, q, delayMs) {
  const name = delayQueue(q, delayMs);
  if (!declaredDelays.has(conn)) declaredDelays.set(conn, new Set());
  if (declaredDelays.get(conn).has(name)) return name;
  await tolerant(conn, (ch) => ch.assertExchange(RETRY, 'direct', { durable: true }));
  await tolerant(conn, (ch) => ch.assertQueue(name, { durable: true, arguments: {
    'x-dead-letter-exchange': DIRECT, 'x-dead-letter-routing-key': q,
    'x-message-ttl': delayMs, 'x-expires': delayMs + 3_600_000 } }));
  await tolerant(conn, (ch) => ch.bindQueue(name, RETRY, delayKey(q, delayMs)));
  declaredDelays.get(conn).add(name);
  return name;
}

// Section 6.1: the properties of a job message; headers per section 6.2.
export function jobProperties(job, headers = {}) {
  const options = {
    messageId: job.id, type: job.type, contentType: CONTENT_TYPE, contentEncoding: 'utf-8',
    timestamp: Math.floor(Date.parse(job.created_at) / 1000), persistent: true, appId: 'ojs',
    headers: {
      'x-ojs-queue': job.queue, 'x-ojs-attempt': int32(1),
      'x-ojs-created-at': job.created_at, 'x-ojs-enqueued-at': job.enqueued_at, ...headers,
    },
  };
  if (Number.isInteger(job.priority)) options.priority = Math.min(9, Math.max(0, job.priority));
  if (job.retry?.max_attempts) options.headers['x-ojs-max-attempts'] = int32(job.retry.max_attempts);
  if (job.scheduled_at) options.headers['x-ojs-scheduled-at'] = job.scheduled_at;
  if (job.meta?.traceparent) options.headers['x-ojs-trace-id'] = job.meta.traceparent;
  if (Array.isArray(job.meta?.tags)) options.headers['x-ojs-tags'] = job.meta.tags.join(',');
  return options;
}

// OJS retry policy defaults; durations are ISO 8601 ("PT1S", "PT0.2S", "PT5M").
export const RETRY_DEFAULTS = { max_attempts: 3, initial_interval: 'PT1S',
  backoff_coefficient: 2.0, max_interval: 'PT5M', jitter: true, non_retryable_errors: [] };

export function durationMs(text) {
  const m = /^P(?:(\d+(?:\.\d+)?)D)?(?:T(?:(\d+(?:\.\d+)?)H)?(?:(\d+(?:\.\d+)?)M)?(?:(\d+(?:\.\d+)?)S)?)?$/.exec(text);
  if (!m || text === 'P' || text.endsWith('T')) throw new RangeError(`not an ISO 8601 duration: ${text}`);
  const [d, h, min, s] = m.slice(1).map((v) => Number(v ?? 0));
  return Math.round((((d * 24 + h) * 60 + min) * 60 + s) * 1000);
}

// delay(n) = min(initial * coefficient^(n-1), max), jittered by [0.5, 1.5), capped again.
export function retryDelayMs(policy, attempt, random = Math.random) {
  const p = { ...RETRY_DEFAULTS, ...policy };
  const max = durationMs(p.max_interval);
  let delay = Math.min(durationMs(p.initial_interval) * p.backoff_coefficient ** (attempt - 1), max);
  if (p.jitter) delay = Math.min(delay * (0.5 + random()), max);
  return Math.max(1, Math.round(delay));
}
