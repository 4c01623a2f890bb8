#!/usr/bin/env node
// The response cache's hit path end to end: `switchboard serve --cache memory`
// (or --cache redis://...) answering one deterministic chat request again and
// again, timed at the client (node:http on a kept-alive connection, one
// request at a time) and inside the server (the request log's latency_ms:
// from the request's head arriving to its answer queued: parse, chat
// template, tokenization, key, lookup, replay, rendering). Misses (a new
// question each time, max_tokens 16) are timed the same way for contrast.
// Prints p50 / p99 / mean in microseconds.
//
//   node bench/cache.mjs [--bin build/switchboard] [--model FILE (stories260K)] [--requests 5000]
//                        [--cache memory|redis://127.0.0.1:6379]
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const opt = (name, dflt) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1] : dflt;
};
const BIN = opt('bin', process.env.SB_BIN || path.join(root, 'build/switchboard'));
const MODEL = opt('model', path.resolve(root, '../shared/models/stories260K.gguf'));
const N = Number(opt('requests', '5000'));
const CACHE = opt('cache', 'memory');
const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sb-bench-cache-'));
const logFile = path.join(dir, 'req.log');

const proc = spawn(BIN, ['serve', '-m', MODEL, '--alias', 'm', '--port', '0', '--quiet', '--cache', CACHE,
  '--request-log', logFile, '--request-log-max-bytes', '1G'], { stdio: ['ignore', 'ignore', 'pipe'] });
let err = '';
const port = await new Promise((resolve, reject) => {
  proc.stderr.on('data', (d) => {
    err += d;
    const m = /listening on http:\/\/[^:\s]+:(\d+)/.exec(err);
    if (m) resolve(Number(m[1]));
  });
  proc.on('exit', (c) => reject(new Error(`server exited (${c}):\n${err}`)));
});
while ((await fetch(`http://127.0.0.1:${port}/health`).catch(() => ({ status: 0 }))).status !== 200)
  await new Promise((r) => setTimeout(r, 50));

const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
function post(body) {
  const data = JSON.stringify(body);
  return new Promise((resolve, reject) => {
    const t0 = process.hrtime.bigint();
    const req = http.request({ host: '127.0.0.1', port, path: '/v1/chat/completions', method: 'POST', agent,
      headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(data) } }, (res) => {
      res.resume();
      res.on('end', () => resolve({ us: Number(process.hrtime.bigint() - t0) / 1e3, cache: res.headers['x-switchboard-cache'] }));
    });
    req.on('error', reject);
    req.end(data);
  });
}
const question = (i) => ({ model: 'm', messages: [{ role: 'system', content: 'You tell short stories.' },
  { role: 'user', content: `Tell me a story about ${i}` }], max_tokens: 16, temperature: 0 });

const stats = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  const q = (p) => s[Math.min(s.length - 1, Math.floor(p * s.length))];
  return `p50 ${q(0.5).toFixed(0).padStart(6)}  p99 ${q(0.99).toFixed(0).padStart(6)}  mean ${(s.reduce((a, b) => a + b, 0) / s.length).toFixed(0).padStart(6)}`;
};

const missClient = [], hitClient = [];
for (let i = 0; i < Math.min(N, 500); i++) {
  const r = await post(question(`miss ${i}`));
  if (r.cache !== 'miss') throw new Error(`expected a miss, got ${r.cache}`);
  missClient.push(r.us);
}
await post(question('the hit'));
for (let i = 0; i < N; i++) {
  const r = await post(question('the hit'));
  if (r.cache !== 'hit') throw new Error(`expected a hit, got ${r.cache}`);
  hitClient.push(r.us);
}
proc.kill('SIGTERM');
await new Promise((r) => proc.on('exit', r));
const lines = fs.readFileSync(logFile, 'utf8').trim().split('\n').map((l) => JSON.parse(l));
const server = (c) => lines.filter((l) => l.cache === c).map((l) => l.latency_ms * 1e3);
fs.rmSync(dir, { recursive: true, force: true });

console.log(`cache ${CACHE}, ${N} hits, ${missClient.length} misses (max_tokens 16), load average ${os.loadavg().map((x) => x.toFixed(2)).join(' ')}`);
console.log(`hit   client ${stats(hitClient)} us`);
console.log(`hit   server ${stats(server('hit'))} us`);
console.log(`miss  client ${stats(missClient)} us`);
console.log(`miss  server ${stats(server('miss'))} us`);
