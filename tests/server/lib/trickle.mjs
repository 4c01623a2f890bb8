// The slow-client load of issue 17's fourth criterion, shared by
// tests/server/hostile.mjs (which checks that the sockets are closed by the
// header deadline and that a normal client is still served) and
// bench/trickle.mjs (which measures how much they slow that client down).
import { Worker } from 'node:worker_threads';
import { postJSON, MODEL_ID } from './harness.mjs';

// p99 in ms of sequential small completions: at least n of them, for at
// least minS seconds, but never past maxS.
export async function completionP99(url, n, minS = 0, maxS = Infinity) {
  const body = { model: MODEL_ID, prompt: 'Once upon a time', max_tokens: 4, temperature: 0 };
  const ms = [];
  const t0 = Date.now();
  for (let i = 0; (i < n || Date.now() - t0 < minS * 1000) && Date.now() - t0 < maxS * 1000; i++) {
    const t = performance.now();
    const r = await postJSON(`${url}/v1/completions`, body);
    ms.push(performance.now() - t);
    if (r.status !== 200) throw new Error(`a normal completion got ${r.status}`);
  }
  ms.sort((a, b) => a - b);
  return { p99: ms[Math.ceil(ms.length * 0.99) - 1], p50: ms[Math.floor(ms.length / 2)], n: ms.length };
}

// Opens n sockets from a worker thread (so that its writes do not delay the
// caller's measurements), each sending one byte of a request head per second.
// `opened` resolves once all are connected; `closed` with the seconds from
// then until the server had closed every one; stop() ends the worker.
export function trickleSockets(port, n = 1000) {
  const worker = new Worker(
    `const net = require('node:net');
     const { workerData, parentPort } = require('node:worker_threads');
     let open = 0, closed = 0, t0;
     const socks = [];
     for (let i = 0; i < workerData.n; i++) {
       const s = net.connect(workerData.port, '127.0.0.1', () => {
         if (++open === workerData.n) { t0 = Date.now(); parentPort.postMessage('open'); }
       });
       s.on('error', () => {});
       s.resume();
       s.on('close', () => { if (++closed === workerData.n) parentPort.postMessage((Date.now() - t0) / 1000); });
       socks.push(s);
     }
     let k = 0; const head = 'POST /v1/completions HTTP/1.1\\r\\nHost: x\\r\\n';
     setInterval(() => { for (const s of socks) if (!s.destroyed) s.write(head[k % head.length]); k++; }, 1000);`,
    { eval: true, workerData: { port, n } },
  );
  const messages = [];
  const waiters = [];
  worker.on('message', (m) => (waiters.length ? waiters.shift()(m) : messages.push(m)));
  const next = () => new Promise((resolve) => (messages.length ? resolve(messages.shift()) : waiters.push(resolve)));
  const opened = next().then((m) => {
    if (m !== 'open') throw new Error(`trickle worker said ${m}`);
  });
  return { opened, closed: opened.then(next), stop: () => worker.terminate() };
}
