// An OJS worker in Node.js: FETCH (section 5.2), ACK (5.3), FAIL with retry
// through the retry topology (5.4, 8) or discard to the dead letter queue
// (5.5), and the control queue: CANCEL (5.6) and INFO (5.8).
//
//   node worker.js QUEUE [--prefetch N]
//
// Prints one JSON line per thing that happens to a job (ready, started,
// completed, retrying, dead-lettered, cancelled, info); stops on SIGTERM/SIGINT.
import { hostname } from 'node:os';
import { setTimeout as sleep } from 'node:timers/promises';
import { pathToFileURL } from 'node:url';
import {
  CONTENT_TYPE, CONTROL, RETRY, connect, controlQueue, declareDelayQueue, declareQueue,
  delayKey, int32, isoNow, jobQueue, retryDelayMs,
} from './ojs.js';

const log = (line) => console.log(JSON.stringify(line));

export async function runWorker({ queue, handlers, prefetch = 4, url }) {
  const workerId = `node-${hostname()}-${process.pid}`;
  const states = new Map(); // job id -> { state, attempt }: what INFO answers from
  const cancelled = new Set();
  const running = new Set();
  let live; // the channels of the current connection

  // Ack + republish to ojs.exchange.retry with the next attempt's headers (section 8.3).
  // The copy is confirmed before the original is acked: a crash in between leaves a
  // duplicate, never a lost job (5.4 lists the ack first; the order is ours).
  async function retry(at, msg, job, attempt, err) {
    const delayMs = retryDelayMs(job.retry, attempt);
    await declareDelayQueue(at.conn, queue, delayMs);
    const headers = Object.fromEntries(Object.entries(msg.properties.headers ?? {})
      .filter(([key]) => key !== 'x-death' && !/^x-(first|last)-death-/.test(key)));
    Object.assign(headers, { 'x-ojs-attempt': int32(attempt + 1),
      'x-ojs-error-code': 'HANDLER_ERROR', 'x-ojs-error-message': String(err.message || err) });
    if (Number.isInteger(headers['x-ojs-max-attempts'])) {
      headers['x-ojs-max-attempts'] = int32(headers['x-ojs-max-attempts']);
    }
    const next = { ...job, attempt, errors: [...(job.errors ?? []), { code: 'HANDLER_ERROR',
      message: String(err.message || err), type: err.name ?? 'Error', attempt, occurred_at: isoNow() }] };
    const { headers: _, expiration: __, ...properties } = msg.properties; // the rest is kept
    await new Promise((resolve, reject) => at.confirms.publish(RETRY, delayKey(queue, delayMs),
      Buffer.from(JSON.stringify(next)), { ...properties, headers, persistent: true,
        expiration: String(delayMs), mandatory: true }, (e) => (e ? reject(e) : resolve())));
    if (at.returned.delete(properties.messageId)) throw new Error(`the retry of ${job.id} was unroutable`);
    at.jobs.ack(msg);
    return delayMs;
  }

  async function onJob(at, msg) {
    if (msg === null) { // Basic.Cancel from the broker (section 10.4): start again
      log({ event: 'consumer-cancelled', queue });
      await sleep(1000);
      await declareQueue(at.conn, queue);
      at.consumerTag = (await at.jobs.consume(jobQueue(queue), (m) => consume(at, m))).consumerTag;
      return;
    }
    const headers = msg.properties.headers ?? {};
    let job;
    try {
      if (!msg.properties.contentType?.startsWith(CONTENT_TYPE)) throw new Error('not an OJS job');
      job = JSON.parse(msg.content);
      if (typeof job.id !== 'string' || !Array.isArray(job.args) || !handlers[job.type]) {
        throw new Error(`no handler for type ${job.type}`);
      }
    } catch (err) { // not a job this worker can run: discard it to the DLQ
      at.jobs.nack(msg, false, false);
      log({ event: 'dead-lettered', id: msg.properties.messageId, reason: err.message });
      return;
    }
    const attempt = Number(headers['x-ojs-attempt'] ?? 1);
    const maxAttempts = Number(job.retry?.max_attempts ?? headers['x-ojs-max-attempts'] ?? 3);
    if (cancelled.has(job.id)) { // CANCEL arrived before the job: never start it
      at.jobs.ack(msg);
      states.set(job.id, { state: 'cancelled', attempt });
      log({ event: 'cancelled', id: job.id });
      return;
    }
    states.set(job.id, { state: 'active', attempt });
    running.add(job.id);
    log({ event: 'started', id: job.id, type: job.type, attempt, max_attempts: maxAttempts,
      error_code: headers['x-ojs-error-code'] ?? null });
    try {
      const context = { job, attempt, cancelled: () => cancelled.has(job.id) };
      const result = await handlers[job.type](job.args, context);
      at.jobs.ack(msg); // ACK: Basic.Ack(delivery_tag, multiple=false)
      states.set(job.id, { state: 'completed', attempt });
      log({ event: 'completed', id: job.id, attempt, result: result ?? null });
    } catch (err) {
      const retryable = !(job.retry?.non_retryable_errors ?? []).some((name) => name === err.name
        || (name.endsWith('.*') && String(err.name).startsWith(name.slice(0, -1))));
      if (retryable && attempt < maxAttempts) {
        const delayMs = await retry(at, msg, job, attempt, err);
        states.set(job.id, { state: 'retryable', attempt });
        log({ event: 'retrying', id: job.id, attempt, delay_ms: delayMs, error: err.message });
      } else { // out of attempts: FAIL (discard) is Basic.Nack(requeue=false) (AMQP-009)
        at.jobs.nack(msg, false, false);
        states.set(job.id, { state: 'discarded', attempt });
        log({ event: 'dead-lettered', id: job.id, attempt, error: err.message });
      }
    } finally {
      running.delete(job.id);
    }
  }

  // A job whose channel closed under it (the connection was lost) cannot be settled:
  // the broker delivers it again.  Any other failure to settle ends the process.
  function consume(at, msg) {
    onJob(at, msg).catch((err) => {
      if (at.closed) {
        log({ event: 'unsettled', id: msg?.properties.messageId, reason: 'connection lost' });
        return;
      }
      console.error(`worker: ${err.message}; exiting, unacked jobs go back to the queue`);
      process.exit(1);
    });
  }

  // Control messages: JSON bodies told apart by their type property.
  function onControl(at, msg) {
    if (msg === null) return;
    try {
      const body = JSON.parse(msg.content);
      if (msg.properties.type === CONTROL.cancel) {
        cancelled.add(body.job_id);
        log({ event: 'cancel', id: body.job_id, running: running.has(body.job_id) });
      } else if (msg.properties.type === CONTROL.info && isOwnReplyQueue(msg.properties.replyTo)) {
        const known = states.get(body.job_id);
        const answer = { job_id: body.job_id, state: known?.state ?? 'not_found',
          ...(known && { attempt: known.attempt, worker_id: workerId }) };
        at.control.sendToQueue(msg.properties.replyTo, Buffer.from(JSON.stringify(answer)), {
          correlationId: msg.properties.correlationId, contentType: 'application/json' });
        log({ event: 'info', ...answer });
      }
    } catch (err) {
      console.error(`worker: unreadable control message: ${err.message}`);
    }
    at.control.ack(msg); // never loop on a control message
  }

  // After every (re)connection: declare the topology, open the channels, consume.
  async function setup(conn) {
    await declareQueue(conn, queue); // eager declaration (section 7.3)
    const at = { conn, jobs: await conn.createChannel(), closed: false, returned: new Set(),
      confirms: await conn.createConfirmChannel(), control: await conn.createChannel() };
    at.jobs.on('close', () => { at.closed = true; });
    // Basic.Return comes before the confirm: a returned retry must not be acked.
    at.confirms.on('return', (m) => at.returned.add(m.properties.messageId));
    await at.jobs.prefetch(prefetch); // Basic.Qos before Basic.Consume (AMQP-007)
    at.consumerTag = (await at.jobs.consume(jobQueue(queue), (m) => consume(at, m),
      { noAck: false })).consumerTag;
    await at.control.consume(controlQueue(queue), (m) => onControl(at, m), { noAck: false });
    live = at;
    log({ event: 'ready', queue, worker_id: workerId });
  }

  const conn = await connect(url, setup);
  return async function stop() {
    await live.jobs.cancel(live.consumerTag);
    while (running.size) await sleep(50); // let running jobs finish and ack
    await conn.close();
  };
}

// Example handlers: an OJS type is a name both languages agree on.
export const handlers = {
  'report.sum': (numbers) => numbers.reduce((a, b) => a + b, 0),
  'payment.charge': ([customer, cents]) => {
    throw Object.assign(new Error(`card of ${customer} declined for ${cents} cents`), { name: 'CardDeclined' });
  },
  'export.slow': async ([ms], { cancelled }) => {
    for (const end = Date.now() + ms; Date.now() < end && !cancelled();) await sleep(20);
    return cancelled() ? 'stopped early' : `slept ${ms} ms`;
  },
};

if (import.meta.url === pathToFileURL(process.argv[1]).href) {
  const argv = process.argv.slice(2);
  const at = argv.indexOf('--prefetch');
  const prefetch = at < 0 ? 4 : Number(argv.splice(at, 2)[1]);
  const stop = await runWorker({ queue: argv[0] ?? 'default', handlers, prefetch });
  for (const signal of ['SIGTERM', 'SIGINT']) {
    process.once(signal, () => stop().then(() => process.exit(0)));
  }
}

// Answer INFO only into a reply queue of the requester's own (direct reply-to, or a
// server-named queue), never into a job, dead-letter or control queue named by the
// request: the default exchange would reach any of them.
function isOwnReplyQueue(replyTo) {
  return /^(amq\.rabbitmq\.reply-to\.|amq\.gen-)./.test(replyTo ?? '');
}
