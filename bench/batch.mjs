#!/usr/bin/env node
// Batch throughput: the same N completion requests (greedy, --tokens each)
//   1. through `switchboard batch --parallel 8` (in process, durable state),
//   2. through `switchboard serve`, one request at a time,
//   3. through `switchboard serve`, 8 concurrent clients,
// as generated tokens per second of wall time (batch: from its first
// request to its last, as its summary line says; the model load is not
// counted in any of them). Prints the load average beside each figure:
// the machine is shared.
//
//   node bench/batch.mjs [--bin build/switchboard] [--model FILE] [--requests 32] [--tokens 48] [--threads 2]
// --model defaults to /tmp/batch-bench-110m-q4_0.gguf, generated when
// missing: the 110M-parameter Q4_0 llama shape, random weights, seed 1.
import { spawn, spawnSync, execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

const { values: args } = parseArgs({
  options: {
    bin: { type: 'string', default: process.env.SB_BIN || path.resolve(fileURLToPath(import.meta.url), '../../build/switchboard') },
    model: { type: 'string', default: '/tmp/batch-bench-110m-q4_0.gguf' },
    requests: { type: 'string', default: '32' },
    tokens: { type: 'string', default: '48' },
    threads: { type: 'string', default: '2' },
  },
});
const { bin: BIN, model: MODEL, threads: THREADS } = args;
const N = Number(args.requests), TOKENS = Number(args.tokens);
if (!fs.existsSync(MODEL)) // the 110M shape, random weights
  execFileSync(BIN, ['gen-model', '--type', 'q4_0', '--dim', '768', '--hidden', '2048', '--layers', '12', '--heads', '12',
    '--kv-heads', '12', '--vocab', '32000', '--ctx', '2048', '--seed', '1', '--out', MODEL], { stdio: 'inherit' });
const MODEL_ID = path.basename(MODEL).replace(/\.gguf$/, '');
const load = () => os.loadavg().map((x) => x.toFixed(1)).join(' ');

// ignore_eos-free greedy requests: a random model rarely stops early, and each answer says how many it made.
const bodies = Array.from({ length: N }, (_, i) => ({ model: MODEL_ID, prompt: `Once upon a time, number ${i},`,
  max_tokens: TOKENS, temperature: 0 }));
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'batch-bench-'));
const rows = [];

// 1. switchboard batch.
{
  const input = path.join(tmp, 'in.jsonl');
  fs.writeFileSync(input, bodies.map((body, i) => JSON.stringify({ custom_id: `r${i}`, method: 'POST', url: '/v1/completions', body })).join('\n') + '\n');
  const before = load();
  const r = spawnSync(BIN, ['batch', input, '-o', path.join(tmp, 'out.jsonl'), '-m', MODEL, '--parallel', '8',
    '--threads', THREADS, '--state-dir', path.join(tmp, 'state')], { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(r.stderr);
  const m = /\((\d+) tokens in ([\d.]+) s/.exec(r.stderr);
  rows.push({ mode: 'switchboard batch --parallel 8', tokens: Number(m[1]), seconds: Number(m[2]), load: `${before} / ${load()}` });
}

// 2 and 3: the server.
const proc = spawn(BIN, ['serve', '-m', MODEL, '--port', '0', '--threads', THREADS, '--parallel', '8', '--quiet'],
  { stdio: ['ignore', 'ignore', 'pipe'] });
let log = '';
const port = await new Promise((resolve) => proc.stderr.on('data', (d) => {
  log += d;
  const m = /listening on http:\/\/[^:\s]+:(\d+)/.exec(log);
  if (m) resolve(Number(m[1]));
}));
const url = `http://127.0.0.1:${port}/v1/completions`;
for (;;) {
  try {
    if ((await fetch(`http://127.0.0.1:${port}/health`)).status === 200) break;
  } catch {}
  await new Promise((r) => setTimeout(r, 50));
}
const post = async (body) => {
  const r = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  return (await r.json()).usage.completion_tokens;
};
await post({ ...bodies[0], max_tokens: 1 }); // the model loads now, not inside a measurement

async function serverRun(mode, concurrency) {
  const before = load();
  let next = 0, tokens = 0;
  const t0 = performance.now();
  await Promise.all(Array.from({ length: concurrency }, async () => {
    while (next < N) {
      const made = await post(bodies[next++]); // (not `tokens += await`: that adds to a stale sum)
      tokens += made;
    }
  }));
  rows.push({ mode, tokens, seconds: (performance.now() - t0) / 1000, load: `${before} / ${load()}` });
}
await serverRun('serve, one request at a time', 1);
await serverRun('serve, 8 concurrent clients', 8);
proc.kill('SIGTERM');
await new Promise((r) => proc.on('exit', r));
fs.rmSync(tmp, { recursive: true, force: true });

console.log(`${N} requests x ${TOKENS} tokens, ${MODEL_ID}, --threads ${THREADS}`);
console.log('| mode | tokens | seconds | tokens/s | load avg before / after |');
console.log('|---|---|---|---|---|');
for (const r of rows) console.log(`| ${r.mode} | ${r.tokens} | ${r.seconds.toFixed(1)} | ${(r.tokens / r.seconds).toFixed(1)} | ${r.load} |`);
