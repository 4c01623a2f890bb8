#!/usr/bin/env node
// Constrained against unconstrained generation speed through `switchboard
// serve`: tokens/s at 1 and 8 concurrent requests, plain chat answers
// against answers inside a JSON string (where a random model, and a real
// one writing prose into JSON, spends its tokens), on the 110M llama shape with the Llama 3 vocabulary
// (128,256 tokens: the largest masks). Each level alternates the two modes
// for --rounds rounds after one warm-up each (the grammar's masks are then
// cached, as on a server that has seen the schema); the median is printed.
//
//   node bench/structured.mjs [--bin build/switchboard] [--threads 2] [--tokens 64] [--rounds 3]
import { spawn, execFileSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const opt = (name, dflt) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1] : dflt;
};
const BIN = opt('bin', path.join(root, 'build/switchboard'));
const TOKENS = Number(opt('tokens', '64'));
const ROUNDS = Number(opt('rounds', '3'));
const MODEL = path.join(root, 'build/bench-110m-llama3vocab-q4_0.gguf');
if (!existsSync(MODEL))
  execFileSync(BIN, ['gen-model', '--dim', '768', '--hidden', '2048', '--layers', '12', '--heads', '12', '--kv-heads', '12',
    '--vocab-from', path.join(root, '../shared/models/llama3-vocab-tiny-random.gguf'), '--type', 'q4_0', '--out', MODEL],
  { stdio: 'inherit' });

const proc = spawn(BIN, ['serve', '-m', MODEL, '--port', '0', '--threads', opt('threads', '2'), '--parallel', '8',
  '--alias', 'm', '--quiet'], { stdio: ['ignore', 'ignore', 'pipe'] });
let log = '';
const port = await new Promise((resolve, reject) => {
  proc.stderr.on('data', (d) => {
    log += d;
    const m = /listening on http:\/\/[^:\s]+:(\d+)/.exec(log);
    if (m) resolve(Number(m[1]));
  });
  proc.on('exit', (c) => reject(new Error(`server exited (${c}):\n${log}`)));
});
const url = `http://127.0.0.1:${port}`;
while ((await fetch(`${url}/health`).catch(() => ({ status: 0 }))).status !== 200) await new Promise((r) => setTimeout(r, 50));

// A JSON string that never closes: every answer runs to max_tokens in both
// modes (a schema's answer would end early and weigh its prompt more).
const grammar = 'root ::= "{\\"text\\": \\"" ([^"\\\\\\x00-\\x1F] | "\\\\" ["\\\\/bfnrt])*\n';
async function one(constrained, seed) {
  const body = { model: 'm', messages: [{ role: 'user', content: 'Write.' }], max_tokens: TOKENS, seed,
    ...(constrained ? { grammar } : {}) };
  const r = await fetch(`${url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body) });
  const j = await r.json();
  if (r.status !== 200) throw new Error(JSON.stringify(j));
  return j.usage.completion_tokens;
}
async function rate(constrained, streams, seed) {
  const t0 = performance.now();
  const toks = await Promise.all(Array.from({ length: streams }, (_, i) => one(constrained, seed + i)));
  return toks.reduce((a, b) => a + b, 0) / ((performance.now() - t0) / 1000);
}
const median = (v) => v.slice().sort((a, b) => a - b)[v.length >> 1];
console.log('| streams | unconstrained t/s | constrained t/s | ratio |\n| ---: | ---: | ---: | ---: |');
for (const streams of [1, 8]) {
  await rate(false, streams, 1);
  await rate(true, streams, 1);
  const plain = [], cons = [];
  for (let r = 0; r < ROUNDS; r++) {
    plain.push(await rate(false, streams, 100 + r * 10));
    cons.push(await rate(true, streams, 100 + r * 10));
  }
  const p = median(plain), c = median(cons);
  console.log(`| ${streams} | ${p.toFixed(1)} | ${c.toFixed(1)} | ${(c / p).toFixed(3)} |`);
}
proc.kill('SIGTERM');
