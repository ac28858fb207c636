// Subscribe to OJS events from Node.js: bind a queue of our own to the events
// exchange with event-type patterns ("job.*", "worker.#") and print each event as
// one JSON line.  Messages carry one event (application/json) or a batch, a JSON
// array (application/cloudevents-batch+json).
//
//   node events.js [PATTERN ...]        (default: job.*)
import { pathToFileURL } from 'node:url';
import { EVENTS, connect } from './ojs.js';

// After every (re)connection: a fresh exclusive queue bound with the patterns.
// Events published while disconnected are not seen (the events spec's delivery
// is best-effort).
export function subscribe(patterns, onEvent, url) {
  return connect(url, async (conn) => {
    const ch = await conn.createChannel();
    await ch.assertExchange(EVENTS, 'topic', { durable: true });
    const { queue } = await ch.assertQueue('', { exclusive: true, autoDelete: true });
    for (const pattern of patterns) await ch.bindQueue(queue, EVENTS, pattern);
    await ch.consume(queue, (msg) => {
      if (msg === null) return;
      const decoded = JSON.parse(msg.content);
      for (const event of Array.isArray(decoded) ? decoded : [decoded]) onEvent(event);
    }, { noAck: true });
    console.log(JSON.stringify({ subscribed: patterns }));
  });
}

if (import.meta.url === pathToFileURL(process.argv[1]).href) {
  const patterns = process.argv.length > 2 ? process.argv.slice(2) : ['job.*'];
  const conn = await subscribe(patterns, (event) => console.log(JSON.stringify(event)));
  for (const signal of ['SIGTERM', 'SIGINT']) {
    process.once(signal, () => conn.close().then(() => process.exit(0)));
  }
}
