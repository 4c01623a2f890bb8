#!/usr/bin/env node
// Load benchmark of `switchboard serve`: aggregate generation speed with
// 1, 4, 8 and 16 concurrent streaming clients, time to first token (p50,
// p99), and the server's resident memory before and after 10,000 short
// requests. Prints a table.
//
//   node bench/serve-load.mjs [--bin build/switchboard] [--model FILE] [--threads 2]
//                             [--tokens 64] [--requests 10000] [--rounds 3] [--cache-type f32|f16|q8_0]
// The sweep over 1, 4, 8 and 16 streams runs --rounds times (the levels
// alternate, so a noisy neighbour spreads over all of them); each level's
// rate is the median over rounds, and its ratio to the single-stream median
// is printed.
// Without --model it generates the 110M-parameter Q4_0 llama model into
// build/bench-110m-q4_0.gguf (random weights; gen-model is seeded).
import { spawn, execFileSync } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const opt = (name, dflt) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1] : dflt;
};
const BIN = opt('bin', process.env.SB_BIN || path.join(root, 'build/switchboard'));
const THREADS = opt('threads', '2');
const TOKENS = Number(opt('tokens', '64'));
const REQUESTS = Number(opt('requests', '10000'));
const ROUNDS = Number(opt('rounds', '3'));
const CACHE_TYPE = opt('cache-type', null); // null: the server's default
let MODEL = opt('model', null);
if (!MODEL) {
  MODEL = path.join(root, 'build/bench-110m-q4_0.gguf');
  if (!existsSync(MODEL)) {
    console.error(`generating ${MODEL}`);
    execFileSync(BIN, ['gen-model', '--dim', '768', '--hidden', '2048', '--layers', '12', '--heads', '12', '--kv-heads', '12',
      '--vocab', '32000', '--type', 'q4_0', '--out', MODEL], { stdio: 'inherit' });
  }
}
const MODEL_ID = path.basename(MODEL).replace(/\.gguf$/, '');

const proc = spawn(BIN, ['serve', '-m', MODEL, '--port', '0', '--threads', THREADS, '--parallel', '16',
  ...(CACHE_TYPE ? ['--cache-type', CACHE_TYPE] : []), '--quiet'], {
  stdio: ['ignore', 'ignore', 'pipe'],
});
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

const rssMiB = () => {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${proc.pid}/status`, 'utf8'));
  return Number(m[1]) / 1024;
};

// The client is node:http on kept-alive connections rather than fetch: it
// runs on the same two cores as the server, and fetch's web streams cost
// ~100 us of CPU per event (50-65 with node:http), which at 8 streams took
// ~8% of the machine from the server and ~5% at one stream.
const agent = new http.Agent({ keepAlive: true, maxSockets: 64 });

// POSTs body as JSON to path; onChunk(text) gets the response as it arrives.
// Resolves with the status once the response has ended; rejects with what
// onChunk throws (the connection is then dropped).
function post(path, body, onChunk) {
  const data = JSON.stringify(body);
  return new Promise((resolve, reject) => {
    const req = http.request(`${url}${path}`, {
      method: 'POST', agent,
      headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(data) },
    }, (res) => {
      res.setEncoding('utf8');
      res.on('data', (part) => {
        try {
          onChunk(part);
        } catch (err) {
          req.destroy();
          reject(err);
        }
      });
      res.on('end', () => resolve(res.statusCode));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end(data);
  });
}

// One streaming completion; returns its time to first token and generated
// tokens. Every event is parsed, as a real client would.
const words = 'the cat sat on a warm mat while the old dog slept under the big green tree by the river'.split(' ');
async function stream(i, maxTokens) {
  const prompt = words.slice(0, 3 + (i % 12)).join(' ');
  const t0 = performance.now();
  let ttft = null;
  let buf = '';
  let tokens = 0;
  let done = false;
  const status = await post('/v1/completions', { model: MODEL_ID, prompt, max_tokens: maxTokens, temperature: 0.8,
    seed: i, stream: true, stream_options: { include_usage: true } }, (part) => {
    if (ttft === null) ttft = performance.now() - t0;
    buf += part;
    let k;
    while ((k = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(6, k);
      buf = buf.slice(k + 2);
      if (ev === '[DONE]') {
        done = true;
      } else {
        const j = JSON.parse(ev);
        if (j.error) throw new Error(`stream error: ${ev}`);
        if (j.usage) tokens = j.usage.completion_tokens;
      }
    }
  });
  if (status !== 200 || !done) throw new Error(`HTTP ${status}: ${done ? '' : 'no [DONE]; '}${buf}`);
  return { ttft, tokens };
}

const pct = (xs, p) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))];
};

await stream(0, 4); // warm-up
const levels = [1, 4, 8, 16];
const runs = new Map(levels.map((c) => [c, { tps: [], ttfts: [], requests: 0, tokens: 0, secs: 0 }]));
for (let round = 0; round < ROUNDS; round++) {
  for (const conc of levels) {
    const perClient = conc === 1 ? 4 : 2;
    const t0 = performance.now();
    const results = (
      await Promise.all(
        Array.from({ length: conc }, async (_, c) => {
          const out = [];
          for (let k = 0; k < perClient; k++) out.push(await stream(round * 10000 + c * 100 + k, TOKENS));
          return out;
        }),
      )
    ).flat();
    const secs = (performance.now() - t0) / 1000;
    const tokens = results.reduce((s, r) => s + r.tokens, 0);
    const run = runs.get(conc);
    run.tps.push(tokens / secs);
    run.ttfts.push(...results.map((r) => r.ttft));
    run.requests += results.length;
    run.tokens += tokens;
    run.secs += secs;
  }
}
const rows = levels.map((conc) => {
  const run = runs.get(conc);
  return { conc, ...run, tps: pct(run.tps, 50), min: Math.min(...run.tps), max: Math.max(...run.tps),
    p50: pct(run.ttfts, 50), p99: pct(run.ttfts, 99) };
});

const rssBefore = rssMiB();
const t0 = performance.now();
let next = 0;
let failed = 0;
await Promise.all(
  Array.from({ length: 16 }, async () => {
    while (next < REQUESTS) {
      const i = next++;
      const status = await post('/v1/completions',
        { model: MODEL_ID, prompt: words.slice(0, 2 + (i % 6)).join(' '), max_tokens: 2, temperature: 0 }, () => {});
      if (status !== 200) failed++;
    }
  }),
);
const churnSecs = (performance.now() - t0) / 1000;
const rssAfter = rssMiB();

proc.kill('SIGTERM');
const code = await new Promise((r) => proc.on('exit', r));

console.log(`switchboard serve: ${path.basename(MODEL)}, --threads ${THREADS}, --parallel 16, --cache-type ${CACHE_TYPE ?? "(default)"}, ${TOKENS} tokens per stream, ${ROUNDS} rounds`);
console.log('| streams | requests | tokens | seconds | gen tok/s (median) | min | max | x single | TTFT p50 ms | TTFT p99 ms |');
console.log('|--------:|---------:|-------:|--------:|----------:|----:|----:|---------:|------------:|------------:|');
for (const r of rows)
  console.log(`| ${r.conc} | ${r.requests} | ${r.tokens} | ${r.secs.toFixed(2)} | ${r.tps.toFixed(1)} | ${r.min.toFixed(1)} | ` +
    `${r.max.toFixed(1)} | ${(r.tps / rows[0].tps).toFixed(2)} | ${r.p50.toFixed(0)} | ${r.p99.toFixed(0)} |`);
console.log(`\n${REQUESTS} short requests (16 at a time, 2 tokens each): ${churnSecs.toFixed(1)} s, ${(REQUESTS / churnSecs).toFixed(0)} req/s, ${failed} failed`);
console.log(`server RSS: ${rssBefore.toFixed(1)} MiB before, ${rssAfter.toFixed(1)} MiB after (${(rssAfter - rssBefore >= 0 ? '+' : '') + (rssAfter - rssBefore).toFixed(1)} MiB); exit status ${code}`);
