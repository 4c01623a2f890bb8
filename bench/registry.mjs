// The registry's costs as a client sees them (issue 13, done-when 3), through
// a real `switchboard serve`:
//   load:      a model loaded from the page cache to its first token (a
//              one-token completion on an unloaded model), then the same
//              after an unload, -r times;
//   evict:     two names for the big model under a budget that holds one:
//              each request evicts the other and loads its own (the
//              eviction-then-reload cycle), -r times each;
//   alternate: sequential one-token requests to one model vs alternating
//              between two loaded models: the added cost per request.
// Usage: node bench/registry.mjs --model BIG.gguf [--small SMALL.gguf] [-r 5] [-n 200] [-t 2]
// Prints medians in ms (and the load average, since the machine is shared).
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const BIN = process.env.SB_BIN || path.join(root, 'build/switchboard');
const arg = (name, def) => {
  const i = process.argv.indexOf(name);
  return i > 0 ? process.argv[i + 1] : def;
};
const big = arg('--model', null);
const small = arg('--small', path.join(root, 'models/stories260K-q8_0.gguf'));
const reps = Number(arg('-r', 5)), n = Number(arg('-n', 200)), threads = arg('-t', '2');
if (!big) {
  console.error('usage: node bench/registry.mjs --model BIG.gguf [--small SMALL.gguf] [-r 5] [-n 200] [-t 2]');
  process.exit(2);
}

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sb-bench-registry-'));
const reg = path.join(dir, 'models.json');
fs.writeFileSync(reg, JSON.stringify({ models: [
  { name: 'big', path: path.resolve(big), device: 'cpu', context: 512 },
  { name: 'big2', path: path.resolve(big), device: 'cpu', context: 512 },
  { name: 'a', path: path.resolve(small), device: 'cpu' },
  { name: 'b', path: path.resolve(small), device: 'cpu' },
] }));
// Room for one big model and the small ones, not for two big ones.
const budget = `${Math.ceil((fs.statSync(big).size * 1.5) / 2 ** 20)}M`;
const serve = async (extra) => {
  const proc = spawn(BIN, ['serve', '--models', reg, '--port', '0', '--quiet', '-t', threads, '--no-watch', ...extra],
    { stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  const url = await new Promise((resolve, reject) => {
    proc.stderr.on('data', (d) => {
      log += d;
      const m = /listening on (http:\/\/[^\s]+)/.exec(log);
      if (m) resolve(m[1]);
    });
    proc.on('exit', () => reject(new Error(log)));
  });
  for (;;) {
    try {
      if ((await fetch(`${url}/health`)).ok) break;
    } catch {}
    await new Promise((r) => setTimeout(r, 20));
  }
  return { proc, url };
};
const procs = [];
let url = null;

const post = async (p, body) => {
  const r = await fetch(`${url}${p}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  const text = await r.text();
  if (r.status !== 200) throw new Error(`${p}: ${r.status} ${text}`);
  return JSON.parse(text);
};
const oneToken = (model) => post('/v1/completions', { model, prompt: 'Once upon a time', max_tokens: 1, temperature: 0 });
const median = (xs) => [...xs].sort((x, y) => x - y)[Math.floor(xs.length / 2)];
const time = async (f) => {
  const t0 = performance.now();
  await f();
  return performance.now() - t0;
};

try {
  const evicting = await serve(['--memory-budget', budget]);
  procs.push(evicting.proc);
  url = evicting.url;
  const evict = [];
  await oneToken('big');
  for (let r = 0; r < 2 * reps; r++) evict.push(await time(() => oneToken(r % 2 ? 'big' : 'big2')));
  evicting.proc.kill('SIGTERM');

  const plain = await serve([]);
  procs.push(plain.proc);
  url = plain.url;
  const first = await time(() => oneToken('big'));
  const reload = [], warm = [];
  for (let r = 0; r < reps; r++) {
    await post('/admin/models/big/unload', {}); // what an eviction does
    reload.push(await time(() => oneToken('big')));
  }
  for (let r = 0; r < reps; r++) warm.push(await time(() => oneToken('big'))); // the request alone

  await oneToken('a');
  await oneToken('b');
  const same = [], alt = [];
  for (let round = 0; round < 3; round++) { // alternate the two measurements too
    const t1 = await time(async () => { for (let i = 0; i < n; i++) await oneToken('a'); });
    const t2 = await time(async () => { for (let i = 0; i < n; i++) await oneToken(i % 2 ? 'a' : 'b'); });
    same.push(t1 / n);
    alt.push(t2 / n);
  }
  const out = {
    model: path.basename(big),
    threads: Number(threads),
    first_load_to_first_token_ms: first,
    reload_to_first_token_ms_median: median(reload),
    evict_then_reload_to_first_token_ms_median: median(evict),
    budget,
    loaded_request_ms_median: median(warm),
    one_model_request_ms: median(same),
    alternating_request_ms: median(alt),
    alternation_cost_ms: median(alt) - median(same),
    loadavg: os.loadavg(),
  };
  console.log(JSON.stringify(out, null, 2));
} finally {
  for (const p of procs) p.kill('SIGTERM');
  fs.rmSync(dir, { recursive: true, force: true });
}
