// The response cache in Redis (issue 14, accounting half): two servers
// pointed at one real redis-server (started here on a free port, nothing
// saved) share entries: an answer computed by A is a hit on B, as a whole
// answer and as a stream. Then Redis is stopped (SIGSTOP: it accepts
// connections and never answers) and killed (SIGKILL) while both serve:
// no request fails, every one answers within a bound, and the cache comes
// back when Redis does. Skipped only when redis-server is not installed.
import test, { after, before } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { startServer, postJSON, metrics, readSSE, sleep, genModel } from './lib/harness.mjs';

const REDIS = '/usr/bin/redis-server';
const haveRedis = fs.existsSync(REDIS);
const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sb-redis-cache-'));
let redis = null;
after(() => {
  if (redis && redis.exitCode === null) {
    redis.kill('SIGCONT');
    redis.kill('SIGKILL');
  }
  fs.rmSync(dir, { recursive: true, force: true });
});

const freePort = () => new Promise((resolve, reject) => {
  const s = net.createServer();
  s.on('error', reject);
  s.listen(0, '127.0.0.1', () => {
    const { port } = s.address();
    s.close(() => resolve(port));
  });
});

// One RESP command on a fresh connection (enough for DBSIZE / PING here).
function redisCommand(port, ...args) {
  return new Promise((resolve, reject) => {
    const s = net.connect(port, '127.0.0.1');
    let got = '';
    s.setTimeout(2000, () => { s.destroy(); reject(new Error('redis did not answer')); });
    s.on('data', (d) => {
      got += d;
      if (got.endsWith('\r\n')) { s.end(); resolve(got.trim()); }
    });
    s.on('error', reject);
    s.write(`*${args.length}\r\n${args.map((a) => `$${Buffer.byteLength(a)}\r\n${a}\r\n`).join('')}`);
  });
}

async function startRedis(port) {
  const p = spawn(REDIS, ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'], { stdio: 'ignore' });
  for (let i = 0; i < 100; i++) {
    try {
      if ((await redisCommand(port, 'PING')) === '+PONG') return p;
    } catch {}
    await sleep(50);
  }
  throw new Error('redis-server did not start');
}

let registry;
before(() => {
  genModel(path.join(dir, 'm.gguf'), { seed: 31 });
  registry = path.join(dir, 'models.json');
  fs.writeFileSync(registry, JSON.stringify({ models: [{ name: 'm', path: 'm.gguf', device: 'cpu' }] }));
});

const ask = (url, prompt, extra = {}) =>
  postJSON(`${url}/v1/completions`, { model: 'm', prompt, max_tokens: 8, temperature: 0, ...extra });
const hit = (r) => r.headers.get('x-switchboard-cache');

// Requests from both servers (deterministic and not) until stopped: none may fail, each is timed.
function load(urls) {
  let stop = false, i = 0;
  const stats = { n: 0, failed: [], worstMs: 0 };
  const loops = urls.flatMap((url) => [0, 1].map(async (k) => {
    while (!stop) {
      const t0 = Date.now();
      const r = await ask(url, `Story ${i++ % 7}`, k ? { temperature: 0.7 } : {});
      const ms = Date.now() - t0;
      stats.n++;
      stats.worstMs = Math.max(stats.worstMs, ms);
      if (r.status !== 200) stats.failed.push(`${r.status} ${r.text}`);
    }
  }));
  return { stats, stop: async () => { stop = true; await Promise.all(loops); return stats; } };
}

test('two servers share hits through Redis; a stopped or killed Redis fails no request', { skip: !haveRedis && 'redis-server is not installed' }, async (t) => {
  const port = await freePort();
  redis = await startRedis(port);
  const args = ['--cache', `redis://127.0.0.1:${port}`];
  const A = await startServer(args, { registry });
  const B = await startServer(args, { registry });
  try {
    const a1 = await ask(A.url, 'Once upon a time');
    assert.equal(hit(a1), 'miss');
    // A stores off the request's path: wait for the entry to reach Redis.
    for (let k = 0; k < 100 && (await redisCommand(port, 'DBSIZE')) !== ':1'; k++) await sleep(20);
    assert.equal(await redisCommand(port, 'DBSIZE'), ':1');
    const b1 = await ask(B.url, 'Once upon a time');
    assert.equal(hit(b1), 'hit', 'answered by A, a hit on B');
    assert.deepEqual(b1.json.choices, a1.json.choices);
    const r = await fetch(`${B.url}/v1/completions`, {
      method: 'POST', headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'm', prompt: 'Once upon a time', max_tokens: 8, temperature: 0, stream: true }),
    });
    assert.equal(hit(r), 'hit');
    const { chunks } = await readSSE(r);
    assert.equal(chunks.map((c) => c.choices[0]?.text ?? '').join(''), a1.json.choices[0].text);

    // Slow Redis: stopped, it accepts connections and never answers.
    let l = load([A.url, B.url]);
    await sleep(300);
    redis.kill('SIGSTOP');
    await sleep(2500);
    let stats = await l.stop();
    t.diagnostic(`Redis stopped: ${stats.n} requests, slowest ${stats.worstMs} ms`);
    assert.deepEqual(stats.failed, [], 'no request failed while Redis was stopped');
    assert.ok(stats.n > 20, `${stats.n} requests`);
    assert.ok(stats.worstMs < 1500, `the slowest answer took ${stats.worstMs} ms with Redis stopped`);
    assert.ok((await metrics(A.url)).switchboard_cache_backend_errors_total >= 1);

    // Back: within the backoff both servers use the cache again.
    redis.kill('SIGCONT');
    let back = false;
    for (let k = 0; k < 100 && !back; k++) {
      await sleep(200);
      back = hit(await ask(B.url, 'Once upon a time')) === 'hit';
    }
    assert.ok(back, 'the cache works again once Redis answers');

    // Dead Redis.
    l = load([A.url, B.url]);
    await sleep(300);
    redis.kill('SIGKILL');
    await sleep(2500);
    stats = await l.stop();
    t.diagnostic(`Redis killed: ${stats.n} requests, slowest ${stats.worstMs} ms`);
    assert.deepEqual(stats.failed, [], 'no request failed after Redis died');
    assert.ok(stats.worstMs < 1500, `the slowest answer took ${stats.worstMs} ms with Redis dead`);
    const after = await ask(A.url, 'Once upon a time');
    assert.equal(after.status, 200);
    assert.equal(hit(after), 'miss', 'no cache: a miss, not an error');
  } finally {
    await A.stop();
    await B.stop();
  }
});
