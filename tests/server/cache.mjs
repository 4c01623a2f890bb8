// The response cache (issue 14, accounting half): deterministic requests
// (temperature 0, or a seed the client fixed) are answered from the cache
// the second time, with x-switchboard-cache: hit, the same content and a new
// id; a stream and a whole answer share an entry, and a replayed stream has
// the chunks of a live one; non-deterministic requests are never cached;
// any parameter that changes the output is a different entry; entries age
// out (--cache-ttl), the byte bound evicts the least recently used, a hot
// swap of the model's file starts afresh, and /metrics counts it all.
import test, { after, before } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startServer, postJSON, metrics, readSSE, sleep, genModel } from './lib/harness.mjs';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sb-cache-'));
after(() => fs.rmSync(dir, { recursive: true, force: true }));

let registry;
before(() => {
  genModel(path.join(dir, 'a.gguf'), { seed: 11 });
  genModel(path.join(dir, 'b.gguf'), { seed: 12 });
  fs.copyFileSync(path.join(dir, 'a.gguf'), path.join(dir, 'live.gguf'));
  registry = path.join(dir, 'models.json');
  fs.writeFileSync(registry, JSON.stringify({ models: [{ name: 'live', path: 'live.gguf', device: 'cpu' }] }));
});

const chat = (url, extra = {}) => postJSON(`${url}/v1/chat/completions`, {
  model: 'live', messages: [{ role: 'user', content: 'Tell me a story' }], max_tokens: 12, temperature: 0, ...extra,
});
const complete = (url, extra = {}) =>
  postJSON(`${url}/v1/completions`, { model: 'live', prompt: 'Once upon a time', max_tokens: 10, temperature: 0, ...extra });
const cacheHeader = (r) => r.headers.get('x-switchboard-cache');

async function stream(url, endpoint, body) {
  const r = await fetch(`${url}${endpoint}`, {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ ...body, stream: true }),
  });
  assert.equal(r.status, 200);
  const header = cacheHeader(r);
  const { chunks, done } = await readSSE(r);
  assert.ok(done, 'the stream ends with [DONE]');
  return { header, chunks };
}
// A chunk without what differs per response (id, created).
const shape = (chunks) => chunks.map(({ id, created, ...rest }) => rest);
const chatText = (chunks) => chunks.map((c) => c.choices?.[0]?.delta?.content ?? '').join('');

test('deterministic requests hit: same content, new id; streams replay with the live chunk shape', async () => {
  const srv = await startServer(['--cache', 'memory'], { registry });
  try {
    const first = await chat(srv.url);
    assert.equal(first.status, 200, first.text);
    assert.equal(cacheHeader(first), 'miss');
    const second = await chat(srv.url);
    assert.equal(cacheHeader(second), 'hit');
    assert.deepEqual(second.json.choices, first.json.choices);
    assert.notEqual(second.json.id, first.json.id, 'a hit has its own id');
    assert.equal(second.json.usage.prompt_tokens, first.json.usage.prompt_tokens);
    assert.equal(second.json.usage.completion_tokens, first.json.usage.completion_tokens);
    assert.equal(second.json.usage.prompt_tokens_details.cached_tokens, first.json.usage.prompt_tokens,
      'a hit counts its whole prompt as cached');

    // A stream shares the entry with the whole answer (stream is not in the key).
    const replay = await stream(srv.url, '/v1/chat/completions', {
      model: 'live', messages: [{ role: 'user', content: 'Tell me a story' }], max_tokens: 12, temperature: 0,
    });
    assert.equal(replay.header, 'hit');
    assert.equal(chatText(replay.chunks), first.json.choices[0].message.content);

    // A live stream (a new question, with logprobs and usage) against its replay: chunk for chunk.
    const body = {
      model: 'live', messages: [{ role: 'user', content: 'A dragon' }], max_tokens: 9, temperature: 0,
      logprobs: true, top_logprobs: 3, stream_options: { include_usage: true },
    };
    const live = await stream(srv.url, '/v1/chat/completions', body);
    assert.equal(live.header, 'miss');
    const again = await stream(srv.url, '/v1/chat/completions', body);
    assert.equal(again.header, 'hit');
    assert.ok(live.chunks.length > 5, `${live.chunks.length} chunks`);
    const liveUsage = live.chunks.at(-1).usage, againUsage = again.chunks.at(-1).usage;
    assert.equal(againUsage.prompt_tokens_details.cached_tokens, liveUsage.prompt_tokens);
    const noUsage = (chunks) => shape(chunks).map((c) => (c.usage ? { ...c, usage: null } : c));
    assert.deepEqual(noUsage(again.chunks), noUsage(live.chunks), 'the replay has the live chunk shape');
    assert.equal(chatText(again.chunks), chatText(live.chunks));
    // And the whole answer from the entry the stream made: the same text and logprobs.
    const whole = await chat(srv.url, { messages: body.messages, max_tokens: 9, logprobs: true, top_logprobs: 3 });
    assert.equal(cacheHeader(whole), 'hit');
    assert.equal(whole.json.choices[0].message.content, chatText(live.chunks));
    assert.equal(whole.json.choices[0].logprobs.content.length,
      live.chunks.filter((c) => c.choices?.[0]?.logprobs).reduce((n, c) => n + c.choices[0].logprobs.content.length, 0));

    // Completions, n > 1 too.
    const c1 = await complete(srv.url, { n: 2 });
    const c2 = await complete(srv.url, { n: 2 });
    assert.deepEqual([cacheHeader(c1), cacheHeader(c2)], ['miss', 'hit']);
    assert.deepEqual(c2.json.choices, c1.json.choices);
    const cs = await stream(srv.url, '/v1/completions', { model: 'live', prompt: 'Once upon a time', max_tokens: 10, temperature: 0, n: 2 });
    assert.equal(cs.header, 'hit');
    for (const i of [0, 1])
      assert.equal(cs.chunks.filter((c) => c.choices[0]?.index === i).map((c) => c.choices[0].text).join(''),
        c1.json.choices[i].text);
  } finally {
    await srv.stop();
  }
});

test('non-deterministic requests are never cached; a fixed seed is; any output parameter is its own entry', async () => {
  const srv = await startServer(['--cache', 'memory'], { registry });
  try {
    for (let i = 0; i < 3; i++) {
      const r = await complete(srv.url, { temperature: 0.9 });
      assert.equal(r.status, 200);
      assert.equal(cacheHeader(r), null, 'sampled without a seed: not cacheable');
    }
    const s1 = await complete(srv.url, { temperature: 0.9, seed: 42 });
    const s2 = await complete(srv.url, { temperature: 0.9, seed: 42 });
    assert.deepEqual([cacheHeader(s1), cacheHeader(s2)], ['miss', 'hit']);
    assert.equal(s2.json.choices[0].text, s1.json.choices[0].text);
    assert.equal(cacheHeader(await complete(srv.url, { temperature: 0.9, seed: 43 })), 'miss', 'another seed');

    assert.equal(cacheHeader(await complete(srv.url)), 'miss');
    const variants = [
      { max_tokens: 11 }, { stop: ['\n'] }, { logprobs: 2 }, { top_k: 5, temperature: 0 },
      { frequency_penalty: 0.5 }, { presence_penalty: 0.5 }, { logit_bias: { 5: 3 } }, { prompt: 'Once upon a tim' },
      { top_p: 0.5 }, { n: 3 },
    ];
    for (const v of variants) {
      const r = await complete(srv.url, v);
      assert.equal(r.status, 200, `${JSON.stringify(v)}: ${r.text}`);
      assert.equal(cacheHeader(r), 'miss', `${JSON.stringify(v)} must not share the plain request's entry`);
    }
    // Not part of the key: user, keep_alive, stream_options.
    for (const v of [{ user: 'someone' }, { keep_alive: '10m' }])
      assert.equal(cacheHeader(await complete(srv.url, v)), 'hit', JSON.stringify(v));
    // Chat: response_format and tools change the output.
    assert.equal(cacheHeader(await chat(srv.url)), 'miss');
    assert.equal(cacheHeader(await chat(srv.url, { response_format: { type: 'json_object' } })), 'miss');
    const tools = [{ type: 'function', function: { name: 'f', parameters: { type: 'object', properties: {} } } }];
    assert.equal(cacheHeader(await chat(srv.url, { tools })), 'miss');
    assert.equal(cacheHeader(await chat(srv.url, { tools })), 'hit');
    // Embeddings are not cached.
    const e = await postJSON(`${srv.url}/v1/embeddings`, { model: 'live', input: 'hi' });
    assert.equal(e.status, 200);
    assert.equal(cacheHeader(e), null);
  } finally {
    await srv.stop();
  }
});

test('entries expire after --cache-ttl; the byte bound evicts the least recently used', async () => {
  let srv = await startServer(['--cache', 'memory', '--cache-ttl', '1s'], { registry });
  let entryBytes;
  try {
    assert.equal(cacheHeader(await complete(srv.url)), 'miss');
    assert.equal(cacheHeader(await complete(srv.url)), 'hit');
    entryBytes = (await metrics(srv.url)).switchboard_cache_bytes;
    await sleep(1300);
    assert.equal(cacheHeader(await complete(srv.url)), 'miss', 'expired');
    assert.equal((await metrics(srv.url)).switchboard_cache_expired_total, 1);
  } finally {
    await srv.stop();
  }
  // Room for two entries of this size, not three.
  assert.ok(entryBytes > 100, `an entry takes ${entryBytes} bytes`);
  srv = await startServer(['--cache', 'memory', '--cache-bytes', String(Math.floor(entryBytes * 2.5))], { registry });
  try {
    const p = (s) => complete(srv.url, { prompt: `Once upon a time ${s}` });
    for (const s of ['x', 'y']) assert.equal(cacheHeader(await p(s)), 'miss');
    assert.equal(cacheHeader(await p('x')), 'hit'); // x is now the most recent
    assert.equal(cacheHeader(await p('z')), 'miss'); // evicts y
    assert.equal(cacheHeader(await p('x')), 'hit');
    assert.equal(cacheHeader(await p('z')), 'hit');
    assert.equal(cacheHeader(await p('y')), 'miss', 'the least recently used went');
    const m = await metrics(srv.url);
    assert.ok(m.switchboard_cache_bytes <= entryBytes * 2.5, `${m.switchboard_cache_bytes} bytes held`);
    assert.ok(m.switchboard_cache_evictions_total >= 2);
  } finally {
    await srv.stop();
  }
});

test('a hot swap of the model file never serves the old answers; /metrics counts hits and misses per model', async () => {
  const srv = await startServer(['--cache', 'memory'], { registry });
  try {
    const before = await complete(srv.url, { max_tokens: 16 });
    assert.equal(cacheHeader(await complete(srv.url, { max_tokens: 16 })), 'hit');
    const version = (await (await fetch(`${srv.url}/admin/models`)).json()).data[0].version;
    fs.copyFileSync(path.join(dir, 'b.gguf'), path.join(dir, 'live.tmp'));
    fs.renameSync(path.join(dir, 'live.tmp'), path.join(dir, 'live.gguf'));
    const deadline = Date.now() + 20000;
    for (;;) {
      const m = (await (await fetch(`${srv.url}/admin/models`)).json()).data[0];
      if (m.version > version && m.state === 'loaded') break;
      if (Date.now() > deadline) throw new Error(`no swap: ${JSON.stringify(m)}`);
      await sleep(50);
    }
    const swapped = await complete(srv.url, { max_tokens: 16 });
    assert.equal(cacheHeader(swapped), 'miss', 'the swapped model has no entries yet');
    assert.notEqual(swapped.json.choices[0].text, before.json.choices[0].text, 'new weights, new text');
    assert.equal(cacheHeader(await complete(srv.url, { max_tokens: 16 })), 'hit');
    const m = await metrics(srv.url);
    assert.equal(m['switchboard_cache_hits_total{model="live"}'], 2);
    assert.equal(m['switchboard_cache_misses_total{model="live"}'], 2);
  } finally {
    await srv.stop();
  }
});

test('--cache rejects a bad backend at start', async () => {
  await assert.rejects(startServer(['--cache', 'memcached://x'], { registry }), /not a cache backend/);
  await assert.rejects(startServer(['--cache', 'redis://'], { registry }), /the Redis URL has no host/);
});
