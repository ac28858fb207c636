// An OJS producer in Node.js: PUSH (section 5.1), scheduled PUSH (section 9.1.1),
// CANCEL (5.6) and INFO (5.8) over AMQP 0-9-1.
//
//   node producer.js enqueue QUEUE TYPE '[args]' [--delay-ms N] [--retry '{...}'] [--meta '{...}']
//     (an argument {"$celery": "date", "value": "2026-07-01"} reaches a Celery task as a date)
//   node producer.js info QUEUE JOB_ID
//   node producer.js cancel QUEUE JOB_ID [REASON]
//
// Each command prints one JSON line; the broker URL comes from OJS_AMQP_URL.
import { randomUUID } from 'node:crypto';
import { pathToFileURL } from 'node:url';
import {
  CONTROL, DIRECT, RETRY, connect, controlQueue, declareDelayQueue, declareQueue, delayKey,
  isoNow, jobProperties, newJobId, withCeleryTypes,
} from './ojs.js';

export class Producer {
  static async open(url = process.env.OJS_AMQP_URL ?? 'amqp://guest:guest@localhost:5672') {
    const conn = await connect(url);
    return new Producer(conn, await conn.createConfirmChannel(), loginUser(url));
  }

  constructor(conn, channel, userId = 'guest') {
    this.conn = conn;
    // CANCEL and INFO carry the connection's broker user: RabbitMQ checks user_id
    // against it, and ojs_kombu's workers honour only users authorised for the queue.
    this.userId = userId;
    this.channel = channel; // publisher confirms on every publish (AMQP-014)
    this.returned = new Map(); // messageId -> reason, filled by Basic.Return (AMQP-016)
    this.declared = new Set();
    channel.on('return', (msg) => {
      this.returned.set(msg.properties.messageId, `${msg.fields.replyCode} ${msg.fields.replyText}`);
    });
  }

  // Publish mandatory (AMQP-015) and wait for the broker's confirm.  RabbitMQ sends
  // Basic.Return before the Basic.Ack of an unroutable message, so by the time
  // the confirm arrives we know whether it was returned.
  async publish(exchange, routingKey, body, options, { mandatory = true } = {}) {
    await new Promise((resolve, reject) => {
      this.channel.publish(exchange, routingKey, Buffer.from(JSON.stringify(body)),
        { ...options, mandatory }, (err) => (err ? reject(new Error(`broker nacked ${options.messageId}`)) : resolve()));
    });
    const reason = this.returned.get(options.messageId);
    if (reason) {
      this.returned.delete(options.messageId);
      throw new Error(`job ${options.messageId} is unroutable (${reason}): no queue ${routingKey}`);
    }
  }

  // PUSH.  delayMs > 0 schedules the job: it waits in a delay queue (section
  // 9.1.1, the retry topology of section 8) and reaches its queue when due.
  async enqueue(queue, type, args = [], { delayMs = 0, retry, meta, priority } = {}) {
    if (!this.declared.has(queue)) {
      await declareQueue(this.conn, queue); // lazy declaration (section 7.3)
      this.declared.add(queue);
    }
    const now = Date.now();
    const typed = withCeleryTypes(args);
    const job = { specversion: '1.0', id: newJobId(now), type, queue, args: typed.args,
      created_at: isoNow(now), enqueued_at: isoNow(now) };
    if (delayMs > 0) job.scheduled_at = isoNow(now + delayMs);
    if (retry) job.retry = retry;
    if (Object.keys(typed.types).length) meta = { ...meta, x_celery_types: typed.types };
    if (meta) job.meta = meta;
    if (priority !== undefined) job.priority = priority;
    const options = jobProperties(job);
    if (delayMs > 0) {
      await declareDelayQueue(this.conn, queue, delayMs);
      await this.publish(RETRY, delayKey(queue, delayMs), job, { ...options, expiration: String(delayMs) });
    } else {
      await this.publish(DIRECT, queue, job, options);
    }
    return job;
  }

  // CANCEL: a control message to the queue's control queue.
  async cancel(queue, jobId, reason) {
    const body = reason ? { job_id: jobId, reason } : { job_id: jobId };
    await this.publish(DIRECT, controlQueue(queue), body,
      { ...controlProperties(CONTROL.cancel), userId: this.userId });
  }

  // INFO: RPC with an exclusive, auto-delete (server-named) reply queue and a correlation
  // id; ojs_kombu's workers answer only into such a queue or RabbitMQ's direct reply-to.
  async info(queue, jobId, timeoutMs = 5000) {
    const ch = await this.conn.createChannel();
    try {
      const { queue: replyTo } = await ch.assertQueue('', { exclusive: true, autoDelete: true });
      const correlationId = randomUUID();
      const answer = new Promise((resolve) => {
        ch.consume(replyTo, (msg) => {
          if (msg?.properties.correlationId === correlationId) resolve(JSON.parse(msg.content));
        }, { noAck: true });
      });
      await this.publish(DIRECT, controlQueue(queue), { job_id: jobId },
        { ...controlProperties(CONTROL.info), replyTo, correlationId, userId: this.userId });
      let timer;
      const timeout = new Promise((_, reject) => {
        timer = setTimeout(() => reject(new Error(`no INFO answer for ${jobId} within ${timeoutMs} ms`)), timeoutMs);
      });
      try { return await Promise.race([answer, timeout]); } finally { clearTimeout(timer); }
    } finally {
      await ch.close();
    }
  }

  close() { return this.conn.close(); }
}

// Control messages are JSON (not jobs), identified by their type property.
function controlProperties(type) {
  return { type, messageId: newJobId(), contentType: 'application/json', contentEncoding: 'utf-8',
    persistent: true, appId: 'ojs', timestamp: Math.floor(Date.now() / 1000) };
}

// The user a URL logs in as (amqplib's default: guest).
function loginUser(url) {
  return decodeURIComponent(new URL(url).username) || 'guest';
}

function option(argv, name) {
  const at = argv.indexOf(name);
  return at < 0 ? undefined : argv.splice(at, 2)[1];
}

async function main(argv) {
  const delayMs = Number(option(argv, '--delay-ms') ?? 0);
  const retry = option(argv, '--retry');
  const meta = option(argv, '--meta');
  const [command, queue, ...rest] = argv;
  const producer = await Producer.open();
  try {
    if (command === 'enqueue') {
      const [type, args = '[]'] = rest;
      const job = await producer.enqueue(queue, type, JSON.parse(args), {
        delayMs, retry: retry && JSON.parse(retry), meta: meta && JSON.parse(meta) });
      console.log(JSON.stringify(job));
    } else if (command === 'info') {
      console.log(JSON.stringify(await producer.info(queue, rest[0])));
    } else if (command === 'cancel') {
      await producer.cancel(queue, rest[0], rest[1]);
      console.log(JSON.stringify({ cancelled: rest[0] }));
    } else {
      throw new Error(`unknown command ${command ?? ''}: use enqueue, info or cancel`);
    }
  } finally {
    await producer.close();
  }
}

if (import.meta.url === pathToFileURL(process.argv[1]).href) {
  main(process.argv.slice(2)).catch((err) => {
    console.error(`producer: ${err.message}`);
    process.exit(1);
  });
}
