// Helpers of the gateway's server tests (keys, limits, tiers, Redis):
// `switchboard keys` on a state directory, requests with a key, a private
// redis-server on a free port, and the window check of a token bucket.
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import { BIN, MODEL_ID, postJSON, sleep } from './harness.mjs';

export function keysCli(stateDir, args) {
  const r = spawnSync(BIN, ['keys', ...args, '--state-dir', stateDir], { encoding: 'utf8' });
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

// Creates a key and returns the raw key: the last line of create's output.
export function createKey(stateDir, name, extra = []) {
  const r = keysCli(stateDir, ['create', '--name', name, ...extra]);
  assert.equal(r.status, 0, r.stderr);
  const lines = r.stdout.trimEnd().split('\n');
  const key = lines[lines.length - 1];
  assert.match(key, /^sk-sb-[0-9a-f]{48}$/);
  return key;
}

export const complete = (url, key, extra = {}, headers = {}) =>
  postJSON(`${url}/v1/completions`, { model: MODEL_ID, prompt: 'Once upon a time', max_tokens: 4, temperature: 0, ...extra }, {
    headers: { 'content-type': 'application/json', ...(key ? { authorization: `Bearer ${key}` } : {}), ...headers },
  });

export const get = (url, p, key) => fetch(`${url}${p}`, { headers: key ? { authorization: `Bearer ${key}` } : {} });

export function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
    s.on('error', reject);
  });
}

export const REDIS_SERVER = '/usr/bin/redis-server';
export const haveRedis = () => fs.existsSync(REDIS_SERVER);

// A private redis-server (no persistence) on a free port; stop() kills it.
export async function startRedis() {
  const port = await freePort();
  const proc = spawn(REDIS_SERVER, ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'], {
    stdio: 'ignore',
  });
  const exited = new Promise((resolve) => proc.on('exit', resolve));
  for (let i = 0; i < 500; i++) {
    const ok = await new Promise((resolve) => {
      const c = net.connect(port, '127.0.0.1', () => {
        c.end();
        resolve(true);
      });
      c.on('error', () => resolve(false));
    });
    if (ok) break;
    await sleep(10);
  }
  return {
    port,
    url: `redis://127.0.0.1:${port}`,
    async stop() {
      proc.kill('SIGKILL');
      await exited;
    },
  };
}

// Admission times are only known to lie in [sent, received]. For every
// pair of admitted requests i (earliest sent) and j, the requests sent no
// earlier than i and answered no later than j were admitted inside
// [sent_i, received_j]: their cost must stay within what the bucket can
// give in that window, capacity + rate * window, plus what requests
// gave back meanwhile (`refund`: a token reservation larger than the use;
// every refund of a request answered by then is counted, a bound from
// above). Returns the tightest ratio seen (<= 1 when the bucket held).
export function checkWindows(admitted, capacity, ratePerSecond) {
  const a = [...admitted].sort((x, y) => x.sent - y.sent);
  let worst = 0;
  for (let i = 0; i < a.length; i++)
    for (let j = 0; j < a.length; j++) {
      const w = (a[j].received - a[i].sent) / 1000;
      if (w < 0) continue;
      let cost = 0, refunds = 0;
      for (let k = 0; k < a.length; k++) {
        if (a[k].received > a[j].received) continue;
        refunds += a[k].refund ?? 0;
        if (k >= i) cost += a[k].cost;
      }
      const bound = capacity + ratePerSecond * w + refunds;
      worst = Math.max(worst, cost / bound);
      assert.ok(cost <= bound + 1e-9, `${cost} admitted within ${w.toFixed(3)} s, the bucket allows ${bound.toFixed(2)}`);
    }
  return worst;
}

// Sends `total` requests from `workers` concurrent workers; on a 429 a
// worker checks Retry-After, waits it and sends the same request again, so
// every request ends admitted. Returns the admitted ones (sent, received,
// the response) and every refusal.
export async function hammer({ total, workers, send }) {
  const admitted = [], refused = [];
  let next = 0;
  await Promise.all(Array.from({ length: workers }, async () => {
    while (next < total) {
      const i = next++;
      for (;;) {
        const sent = Date.now();
        const r = await send(i);
        const received = Date.now();
        if (r.status === 200) {
          admitted.push({ i, sent, received, r });
          break;
        }
        assert.equal(r.status, 429, r.text);
        const after = r.headers.get('retry-after');
        assert.match(after ?? '', /^[1-9][0-9]*$/, `a 429 without a Retry-After: ${r.text}`);
        refused.push({ i, sent, received, after: Number(after), r });
        await sleep(Number(after) * 1000);
      }
    }
  }));
  return { admitted, refused };
}
