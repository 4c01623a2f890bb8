// Rate limits (issue 14, admission): 200 requests from 20 concurrent
// workers at a key limited to 5 requests per second never see more
// admitted in any window than the bucket gives (5 + 5 * window seconds);
// every 429 carries Retry-After and the OpenAI x-ratelimit-* headers, and a
// request retried after it succeeds; the same for tokens per minute
// (prompt + max_tokens reserved, settled to the real count); the limits
// hold across models, and a key's headers come on every response.
import test, { after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startServer, genModel, sleep, MODEL, MODEL_ID } from './lib/harness.mjs';
import { checkWindows, complete, createKey, get, hammer } from './lib/gateway.mjs';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sb-gwadmit-limits-'));
after(() => fs.rmSync(dir, { recursive: true, force: true }));

const headerNames = ['limit-requests', 'remaining-requests', 'reset-requests', 'limit-tokens', 'remaining-tokens', 'reset-tokens'];
const ratelimit = (r) => Object.fromEntries(headerNames.map((n) => [n, r.headers.get(`x-ratelimit-${n}`)]));

test('requests per second: 200 requests from 20 workers stay within the bucket in every window', async () => {
  const state = path.join(dir, 'rps');
  const key = createKey(state, 'k', ['--rps', '5']);
  const srv = await startServer(['--state-dir', state]);
  try {
    const t0 = Date.now();
    const { admitted, refused } = await hammer({ total: 200, workers: 20, send: () => complete(srv.url, key, { max_tokens: 1 }) });
    const seconds = (Date.now() - t0) / 1000;
    assert.equal(admitted.length, 200);
    assert.ok(refused.length > 0);
    for (const a of admitted) a.cost = 1;
    const worst = checkWindows(admitted, 5, 5);
    // The bucket is also used: 200 admissions need (200 - 5) / 5 = 39 s at least.
    assert.ok(seconds >= 38, `200 requests took only ${seconds} s`);
    console.log(`# 200 admitted in ${seconds.toFixed(1)} s, ${refused.length} refusals; tightest window at ${(worst * 100).toFixed(0)}% of the bucket`);
    for (const f of refused) {
      const h = ratelimit(f.r);
      assert.equal(h['limit-requests'], '5');
      assert.equal(h['remaining-requests'], '0');
      assert.match(h['reset-requests'], /^\d+ms$|^1s$/);
      assert.equal(h['limit-tokens'], null, 'no token limit, no token headers');
      assert.equal(f.r.json.error.code, 'rate_limit_exceeded');
    }
    const h = ratelimit(admitted[0].r);
    assert.equal(h['limit-requests'], '5');
    assert.match(h['remaining-requests'], /^[0-4]$/);
    // x-request-id on each, distinct.
    const ids = new Set(admitted.map((a) => a.r.headers.get('x-request-id')));
    assert.equal(ids.size, 200);
  } finally {
    await srv.stop();
  }
});

test('a 429 says when to retry, and the retry then succeeds (requests and tokens)', async () => {
  const state = path.join(dir, 'retry');
  const rps = createKey(state, 'rps', ['--rps', '5']);
  const tpm = createKey(state, 'tpm', ['--tpm', '300']);
  const srv = await startServer(['--state-dir', state]);
  try {
    for (let i = 0; i < 5; i++) assert.equal((await complete(srv.url, rps, { max_tokens: 1 })).status, 200);
    const r = await complete(srv.url, rps, { max_tokens: 1 });
    assert.equal(r.status, 429);
    assert.equal(r.json.error.type, 'requests');
    const after = Number(r.headers.get('retry-after'));
    assert.equal(after, 1);
    await sleep(after * 1000);
    assert.equal((await complete(srv.url, rps, { max_tokens: 1 })).status, 200);

    // Tokens: 300 per minute (5 per second). A first request, then one that
    // asks 5 more than is left: refused for about a second, then admitted.
    const first = await complete(srv.url, tpm, { max_tokens: 20 });
    assert.equal(first.status, 200, first.text);
    const prompt = first.json.usage.prompt_tokens;
    const reserved = prompt + 20;
    assert.equal(Number(first.headers.get('x-ratelimit-remaining-tokens')), 300 - reserved);
    assert.equal(first.headers.get('x-ratelimit-limit-tokens'), '300');
    // After settling, the bucket has back what the request did not use; GET /v1/models shows it.
    const peek = await get(srv.url, '/v1/models', tpm);
    const left = Number(peek.headers.get('x-ratelimit-remaining-tokens'));
    assert.ok(left >= 300 - first.json.usage.total_tokens - 1 && left <= 300, `${left} left`);
    const big = { max_tokens: left + 5 - prompt };
    const refused = await complete(srv.url, tpm, big);
    assert.equal(refused.status, 429, refused.text);
    assert.equal(refused.json.error.type, 'tokens');
    const wait = Number(refused.headers.get('retry-after'));
    assert.ok(wait >= 1 && wait <= 2, `Retry-After ${wait}`);
    assert.match(refused.headers.get('x-ratelimit-reset-tokens'), /^(\d+(\.\d+)?s|\d+ms)$/);
    await sleep(wait * 1000);
    const ok = await complete(srv.url, tpm, big);
    assert.equal(ok.status, 200, ok.text);
    // A request larger than the whole bucket: 429 that says so, no Retry-After to wait for.
    const never = await complete(srv.url, tpm, { max_tokens: 400 });
    assert.equal(never.status, 429);
    assert.match(never.json.error.message, /too large/);
  } finally {
    await srv.stop();
  }
});

test('tokens per minute: concurrent requests stay within the bucket; limits hold across models', async () => {
  // Two models on one server: a key's buckets are the key's, whichever model it calls.
  const other = genModel(path.join(dir, 'other.gguf'), { seed: 3 });
  const registry = path.join(dir, 'models.json');
  fs.writeFileSync(registry, JSON.stringify({
    models: [
      { name: MODEL_ID, path: MODEL, device: 'cpu' },
      { name: 'other', path: other, device: 'cpu' },
    ],
  }));
  const state = path.join(dir, 'tpm');
  const probe = createKey(state, 'probe');
  const srv = await startServer(['--state-dir', state], { registry });
  try {
    const maxTokens = 12;
    const p = await complete(srv.url, probe, { max_tokens: maxTokens });
    assert.equal(p.status, 200, p.text);
    const cost = p.json.usage.prompt_tokens + maxTokens; // the reservation of each request below
    const capacity = 30 * cost;
    const key = createKey(state, 'k', ['--tpm', String(capacity)]);
    await sleep(500); // the server sees the new key
    const t0 = Date.now();
    const { admitted, refused } = await hammer({
      total: 36,
      workers: 20,
      send: (i) => complete(srv.url, key, { model: i % 2 ? 'other' : MODEL_ID, max_tokens: maxTokens }),
    });
    const seconds = (Date.now() - t0) / 1000;
    assert.ok(refused.length > 0, 'the bucket was reached');
    // The bucket takes the reservation at admission and gets back, at the
    // request's end, what it did not use.
    for (const a of admitted) {
      a.cost = a.r.json.usage.prompt_tokens + maxTokens;
      a.refund = maxTokens - a.r.json.usage.completion_tokens;
    }
    const worst = checkWindows(admitted, capacity, capacity / 60);
    assert.ok(admitted.some((a) => a.r.json.model === 'other') && admitted.some((a) => a.r.json.model === MODEL_ID));
    // 36 requests at 30 per minute after a burst of 30: at least (36 - 30) * 2 s.
    assert.ok(seconds >= 11, `${seconds} s`);
    const maxCost = Math.max(...admitted.map((a) => a.cost)); // the models' tokenizers differ
    for (const f of refused) {
      assert.equal(f.r.headers.get('x-ratelimit-limit-tokens'), String(capacity));
      assert.ok(Number(f.r.headers.get('x-ratelimit-remaining-tokens')) < maxCost);
      assert.equal(f.r.headers.get('x-ratelimit-limit-requests'), null);
    }
    console.log(`# 36 requests of ${cost} tokens against ${capacity} tpm: ${seconds.toFixed(1)} s, ${refused.length} refusals; tightest window at ${(worst * 100).toFixed(0)}%`);
  } finally {
    await srv.stop();
  }
});
