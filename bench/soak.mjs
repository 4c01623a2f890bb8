// Soak: N minutes of streaming clients against a real `switchboard serve`,
// with random disconnects mid-stream and a share of malformed requests.
// Prints requests, errors by kind, latency percentiles (time to first token
// and whole request) and the server's RSS over time; at the end checks that
// no sequence is left running and that nothing unexpected happened. Not a
// timed test: a benchmark (docs/RELIABILITY.md has the figures).
//   node bench/soak.mjs [--minutes 10] [--clients 64] [--malformed 0.05] [--disconnect 0.1]
//                       [--model ../shared/models/stories260K.gguf] [--bin build/switchboard]
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, '..');
const arg = (name, def) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1] : def;
};
const minutes = Number(arg('minutes', 10));
const clients = Number(arg('clients', 64));
const malformedShare = Number(arg('malformed', 0.05));
const disconnectShare = Number(arg('disconnect', 0.1));
process.env.SB_BIN = arg('bin', process.env.SB_BIN || path.join(root, 'build/switchboard'));
const model = arg('model', path.resolve(root, '../shared/models/stories260K.gguf'));
const { startServer, metrics, sleep, MODEL_ID } = await import('../tests/server/lib/harness.mjs');

const srv = await startServer(['--parallel', '16', '--max-queue', '1024'], { model });
const rss = () => {
  const m = /VmRSS:\s+(\d+) kB/.exec(fs.readFileSync(`/proc/${srv.proc.pid}/status`, 'utf8'));
  return m ? Number(m[1]) / 1024 : NaN;
};

// Deterministic pseudo-random numbers (xorshift), seeded per client.
const rng = (seed) => () => {
  seed ^= seed << 13; seed ^= seed >>> 17; seed ^= seed << 5;
  return (seed >>> 0) / 4294967296;
};

const malformed = [
  '{', '[]', '{"model": "nope", "prompt": "x"}', `{"model": "${MODEL_ID}", "prompt": {"x": 1}}`,
  `{"model": "${MODEL_ID}", "messages": [{"role": "robot", "content": "x"}]}`, `{"model": "${MODEL_ID}", "prompt": "a\\u0000b"}`,
  `{"model": "${MODEL_ID}", "prompt": "x", "max_tokens": -1}`, '\u00ff\u00fe',
];
const counts = { ok: 0, disconnected: 0, malformed_refused: 0 };
const unexpected = {};
const bump = (kind) => (unexpected[kind] = (unexpected[kind] || 0) + 1);
const ttft = [], total = [];
const t0 = Date.now(), end = t0 + minutes * 60e3;
const rssSeries = [[0, rss()]];

async function client(id) {
  const rand = rng(id * 7919 + 1);
  while (Date.now() < end) {
    const r = rand();
    if (r < malformedShare) {
      const body = malformed[Math.floor(rand() * malformed.length)];
      const res = await fetch(`${srv.url}/v1/completions`, { method: 'POST', body }).catch((e) => ({ error: e }));
      if (res.error) bump(`malformed: ${res.error.code || res.error.message}`);
      else if (res.status >= 400 && res.status < 500 && (await res.json()).error?.message) counts.malformed_refused++;
      else bump(`malformed got ${res.status}`);
      continue;
    }
    const disconnect = rand() < disconnectShare;
    const chat = rand() < 0.5;
    const body = chat
      ? { model: MODEL_ID, messages: [{ role: 'user', content: `Tell story ${id}` }], max_tokens: 16 + Math.floor(rand() * 48), stream: true }
      : { model: MODEL_ID, prompt: `Once upon a time ${id}`, max_tokens: 16 + Math.floor(rand() * 48), stream: true };
    const ac = new AbortController();
    const start = performance.now();
    let first = 0, chunks = 0, done = false;
    try {
      const res = await fetch(`${srv.url}/v1/${chat ? 'chat/completions' : 'completions'}`, {
        method: 'POST', body: JSON.stringify(body), signal: ac.signal,
      });
      if (res.status !== 200) {
        bump(`status ${res.status}`);
        await res.text();
        continue;
      }
      const dec = new TextDecoder();
      let buf = '';
      for await (const part of res.body) {
        if (!first) first = performance.now();
        const text = buf + dec.decode(part, { stream: true });
        chunks += (text.match(/\n\n/g) || []).length - (buf.match(/\n\n/g) || []).length;
        done ||= text.includes('data: [DONE]');
        buf = text.slice(-16); // enough to see a marker split between reads
        if (disconnect && chunks >= 2) {
          ac.abort();
          break;
        }
      }
      if (disconnect) counts.disconnected++;
      else if (done) {
        counts.ok++;
        ttft.push(first - start);
        total.push(performance.now() - start);
      } else bump('stream ended without [DONE]');
    } catch (e) {
      if (disconnect && e.name === 'AbortError') counts.disconnected++;
      else bump(`client error: ${e.code || e.name}`);
    }
  }
}

const sampler = setInterval(() => rssSeries.push([Math.round((Date.now() - t0) / 1000), rss()]), 10e3);
await Promise.all(Array.from({ length: clients }, (_, i) => client(i + 1)));
clearInterval(sampler);
rssSeries.push([Math.round((Date.now() - t0) / 1000), rss()]);

// No sequence may be left running once every client is done.
let stuck = null;
for (let i = 0; i < 100; i++) {
  const m = await metrics(srv.url);
  stuck = m.switchboard_running_sequences + m.switchboard_queue_length;
  if (stuck === 0) break;
  await sleep(100);
}
await srv.stop();

const pct = (a, p) => (a.length ? a.sort((x, y) => x - y)[Math.min(a.length - 1, Math.floor(a.length * p))].toFixed(1) : '-');
const rssVals = rssSeries.map(([, v]) => v);
const warm = rssVals.slice(Math.min(3, rssVals.length - 1)); // after the first 30 s
console.log(`soak: ${minutes} min, ${clients} streaming clients, ${malformedShare * 100}% malformed, ${disconnectShare * 100}% disconnects`);
console.log(`requests: ${counts.ok} completed, ${counts.disconnected} disconnected mid-stream, ${counts.malformed_refused} malformed refused (4xx JSON)`);
console.log(`unexpected: ${JSON.stringify(unexpected)}`);
console.log(`latency ms (completed): first token p50 ${pct(ttft, 0.5)} p99 ${pct(ttft, 0.99)}; whole p50 ${pct(total, 0.5)} p99 ${pct(total, 0.99)}`);
console.log(`RSS MB over time (s, MB): ${rssSeries.map(([t, v]) => `${t}:${v.toFixed(1)}`).join(' ')}`);
console.log(`RSS after warm-up: min ${Math.min(...warm).toFixed(1)} max ${Math.max(...warm).toFixed(1)} MB; running+queued after: ${stuck}`);
process.exitCode = Object.keys(unexpected).length || stuck ? 1 : 0;
