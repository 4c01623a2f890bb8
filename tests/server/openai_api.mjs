// The official openai client (and plain fetch for what it cannot send)
// against `switchboard serve` on stories260K: chat and completions,
// streaming and not, usage, stop sequences, seeds, embeddings, the model
// list, and every error status.
import { test, after, before } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer, postJSON, readSSE, metrics, MODEL_ID } from './lib/harness.mjs';

let srv, client;
before(async () => {
  srv = await startServer(['--threads', '2', '--max-body', '1000000']);
  client = new OpenAI({ baseURL: `${srv.url}/v1`, apiKey: 'unused', maxRetries: 0 });
});
after(async () => srv && (await srv.stop()));

const chatMsgs = [
  { role: 'system', content: 'You tell short stories.' },
  { role: 'user', content: 'Tell me about a cat.' },
];

test('model list', async () => {
  const list = await client.models.list();
  assert.deepEqual(list.data.map((m) => m.id), [MODEL_ID]);
  assert.equal(list.data[0].object, 'model');
  const one = await client.models.retrieve(MODEL_ID);
  assert.equal(one.id, MODEL_ID);
  const health = await fetch(`${srv.url}/health`);
  assert.equal(health.status, 200);
  assert.deepEqual(await health.json(), { status: 'ok' });
});

test('chat: non-streaming and streaming agree, with usage', async () => {
  const req = { model: MODEL_ID, messages: chatMsgs, max_tokens: 24, temperature: 0 };
  const whole = await client.chat.completions.create(req);
  assert.equal(whole.object, 'chat.completion');
  assert.match(whole.id, /^chatcmpl-/);
  assert.equal(whole.choices.length, 1);
  const c = whole.choices[0];
  assert.equal(c.message.role, 'assistant');
  assert.ok(c.message.content.length > 0);
  assert.ok(['stop', 'length'].includes(c.finish_reason));
  assert.ok(whole.usage.prompt_tokens > 10);
  assert.ok(whole.usage.completion_tokens > 0 && whole.usage.completion_tokens <= 24);
  assert.equal(whole.usage.total_tokens, whole.usage.prompt_tokens + whole.usage.completion_tokens);

  const stream = await client.chat.completions.create({ ...req, stream: true, stream_options: { include_usage: true } });
  let text = '';
  let finish = null;
  let usage = null;
  let first = true;
  for await (const chunk of stream) {
    assert.equal(chunk.object, 'chat.completion.chunk');
    if (chunk.usage) {
      usage = chunk.usage;
      assert.equal(chunk.choices.length, 0);
      continue;
    }
    assert.equal(chunk.usage, null); // include_usage: null on every other chunk
    const ch = chunk.choices[0];
    if (first) assert.equal(ch.delta.role, 'assistant');
    first = false;
    text += ch.delta.content ?? '';
    if (ch.finish_reason) finish = ch.finish_reason;
  }
  assert.equal(text, c.message.content);
  assert.equal(finish, c.finish_reason);
  assert.deepEqual(
    [usage.prompt_tokens, usage.completion_tokens, usage.total_tokens],
    [whole.usage.prompt_tokens, whole.usage.completion_tokens, whole.usage.total_tokens],
  );

  // Without include_usage no chunk carries usage.
  const plain = await client.chat.completions.create({ ...req, stream: true });
  for await (const chunk of plain) assert.ok(!chunk.usage);
});

test('completions: non-streaming and streaming agree; n and prompt arrays', async () => {
  const req = { model: MODEL_ID, prompt: 'Once upon a time', max_tokens: 20, temperature: 0 };
  const whole = await client.completions.create(req);
  assert.equal(whole.object, 'text_completion');
  assert.equal(whole.choices[0].finish_reason, 'length');
  assert.equal(whole.usage.completion_tokens, 20);
  const stream = await client.completions.create({ ...req, stream: true, stream_options: { include_usage: true } });
  let text = '';
  let usage;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const ch of chunk.choices) text += ch.text;
  }
  assert.equal(text, whole.choices[0].text);
  assert.equal(usage.completion_tokens, 20);

  // Default max_tokens for completions is 16, as OpenAI's.
  const dflt = await client.completions.create({ model: MODEL_ID, prompt: 'Once upon a time', temperature: 0 });
  assert.equal(dflt.usage.completion_tokens, 16);

  // n choices per prompt, several prompts (strings and token ids).
  const multi = await client.completions.create({
    model: MODEL_ID,
    prompt: ['Once upon a time', 'The dog'],
    max_tokens: 6,
    n: 2,
    temperature: 0,
  });
  assert.equal(multi.choices.length, 4);
  assert.deepEqual(multi.choices.map((c) => c.index), [0, 1, 2, 3]);
  // Greedy: each choice is the single greedy answer of its prompt (asked for alone).
  const alone = async (prompt) =>
    (await client.completions.create({ model: MODEL_ID, prompt, max_tokens: 6, temperature: 0 })).choices[0].text;
  const [once, dog] = [await alone('Once upon a time'), await alone('The dog')];
  assert.equal(once, whole.choices[0].text.slice(0, once.length));
  assert.deepEqual(multi.choices.map((c) => c.text), [once, once, dog, dog]);
  const ids = await client.completions.create({ model: MODEL_ID, prompt: [1, 403, 407], max_tokens: 4, temperature: 0 });
  assert.equal(ids.usage.prompt_tokens, 3);

  // logprobs
  const lp = await client.completions.create({ ...req, max_tokens: 5, logprobs: 3 });
  const l = lp.choices[0].logprobs;
  assert.equal(l.tokens.length, 5);
  assert.equal(l.tokens.join(''), lp.choices[0].text);
  assert.ok(l.token_logprobs.every((x) => x <= 0));
  assert.ok(l.top_logprobs.every((t) => Object.keys(t).length === 3));
  const clp = await client.chat.completions.create({ model: MODEL_ID, messages: chatMsgs, max_tokens: 5, temperature: 0, logprobs: true, top_logprobs: 2 });
  const content = clp.choices[0].logprobs.content;
  assert.equal(content.length, 5);
  assert.equal(content.map((t) => t.token).join(''), clp.choices[0].message.content);
  assert.ok(content.every((t) => t.top_logprobs.length === 2 && Array.isArray(t.bytes)));
});

test('stop sequences end the text before the match', async () => {
  const req = { model: MODEL_ID, prompt: 'Once upon a time', max_tokens: 40, temperature: 0 };
  const full = (await client.completions.create(req)).choices[0].text;
  const words = full.split(' ').filter((w) => w.length >= 3);
  const stop = words[Math.floor(words.length / 2)];
  const at = full.indexOf(stop);
  assert.ok(at > 0, `stop word '${stop}' in '${full}'`);
  for (const s of [stop, ['zzzz', stop]]) {
    const r = await client.completions.create({ ...req, stop: s });
    assert.equal(r.choices[0].text, full.slice(0, at));
    assert.equal(r.choices[0].finish_reason, 'stop');
  }
  const stream = await client.completions.create({ ...req, stop, stream: true });
  let text = '';
  for await (const chunk of stream) text += chunk.choices[0]?.text ?? '';
  assert.equal(text, full.slice(0, at));
});

test('seed: same seed same text, other seeds differ', async () => {
  const req = { model: MODEL_ID, prompt: 'The little bird', max_tokens: 30, temperature: 0.8 };
  const a = (await client.completions.create({ ...req, seed: 42 })).choices[0].text;
  const b = (await client.completions.create({ ...req, seed: 42 })).choices[0].text;
  assert.equal(a, b);
  const others = await Promise.all([1, 2, 3, 4].map(async (seed) => (await client.completions.create({ ...req, seed })).choices[0].text));
  assert.ok(others.some((t) => t !== a), 'different seeds gave the same text');
  const c1 = (await client.chat.completions.create({ model: MODEL_ID, messages: chatMsgs, max_tokens: 20, temperature: 0.8, seed: 7 })).choices[0].message.content;
  const c2 = (await client.chat.completions.create({ model: MODEL_ID, messages: chatMsgs, max_tokens: 20, temperature: 0.8, seed: 7 })).choices[0].message.content;
  assert.equal(c1, c2);
});

test('embeddings: string and array input, normalized, float and base64', async () => {
  const norm = (v) => Math.sqrt(v.reduce((s, x) => s + x * x, 0));
  const one = await client.embeddings.create({ model: MODEL_ID, input: 'hello there' }); // the client asks for base64
  assert.equal(one.data.length, 1);
  const v = one.data[0].embedding;
  assert.ok(v.length > 0);
  assert.ok(Math.abs(norm(v) - 1) < 1e-3);
  assert.ok(one.usage.prompt_tokens > 0);
  const many = await client.embeddings.create({ model: MODEL_ID, input: ['hello there', 'a cat sat'], encoding_format: 'float' });
  assert.equal(many.data.length, 2);
  assert.deepEqual(many.data.map((d) => d.index), [0, 1]);
  for (const d of many.data) assert.ok(Math.abs(norm(d.embedding) - 1) < 1e-3);
  for (let i = 0; i < v.length; i++) assert.ok(Math.abs(v[i] - many.data[0].embedding[i]) < 1e-6);
  assert.ok(many.data[0].embedding.some((x, i) => Math.abs(x - many.data[1].embedding[i]) > 1e-4));
});

async function expectError(promise, status, param) {
  try {
    await promise;
  } catch (e) {
    assert.equal(e.status, status, e.message);
    if (param !== undefined) assert.equal(e.error?.param ?? e.param, param);
    return e;
  }
  assert.fail(`expected HTTP ${status}`);
}

test('errors: 400 bad JSON, unsupported field, wrong type; 404; 405; 413', async () => {
  const bad = await postJSON(`${srv.url}/v1/chat/completions`, '{"model": "stories260K", "messages": [');
  assert.equal(bad.status, 400);
  assert.equal(bad.json.error.type, 'invalid_request_error');
  assert.match(bad.json.error.message, /not valid JSON/);
  assert.ok('param' in bad.json.error && 'code' in bad.json.error);

  const functions = [{ name: 'f', parameters: { type: 'object', properties: {} } }];
  const e1 = await expectError(client.chat.completions.create({ model: MODEL_ID, messages: chatMsgs, functions }), 400, 'functions');
  assert.match(e1.message, /functions/);
  const tools = [{ type: 'function', function: { name: 'f g', parameters: { type: 'object', properties: {} } } }];
  await expectError(client.chat.completions.create({ model: MODEL_ID, messages: chatMsgs, tools }), 400, 'tools[0]');
  await expectError(client.chat.completions.create({ model: MODEL_ID, messages: chatMsgs, logit_bias: { 999999: 1 } }), 400, 'logit_bias');
  await expectError(
    client.chat.completions.create({ model: MODEL_ID, messages: chatMsgs, response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { not: {} } } } }),
    400,
    'response_format.json_schema.schema',
  );
  await expectError(client.chat.completions.create({ model: MODEL_ID, messages: chatMsgs, temperature: 'hot' }), 400, 'temperature');
  await expectError(client.chat.completions.create({ model: MODEL_ID, messages: 'hi' }), 400, 'messages');
  await expectError(client.chat.completions.create({ model: MODEL_ID, messages: [{ role: 'user', content: 5 }] }), 400, 'messages[0].content');
  await expectError(client.completions.create({ model: MODEL_ID, prompt: 'x', max_tokens: 'ten' }), 400, 'max_tokens');
  await expectError(client.completions.create({ model: MODEL_ID, prompt: 'x', stop: 3 }), 400, 'stop');
  await expectError(client.completions.create({ model: MODEL_ID, prompt: 'x', temperature: 7 }), 400, 'temperature');
  await expectError(client.completions.create({ model: MODEL_ID, prompt: [100000] }), 400, 'prompt');
  await expectError(client.embeddings.create({ model: MODEL_ID, input: 42 }), 400, 'input');
  // Fields OpenAI does not define are ignored.
  const ok = await postJSON(`${srv.url}/v1/completions`, { model: MODEL_ID, prompt: 'x', max_tokens: 2, frobnicate: true });
  assert.equal(ok.status, 200);

  const e404 = await expectError(client.chat.completions.create({ model: 'gpt-4o', messages: chatMsgs }), 404, 'model');
  assert.equal(e404.code, 'model_not_found');
  await expectError(client.embeddings.create({ model: 'nope', input: 'x' }), 404);
  const path404 = await fetch(`${srv.url}/v1/nope`);
  assert.equal(path404.status, 404);
  assert.ok((await path404.json()).error.message);

  const r405 = await fetch(`${srv.url}/v1/chat/completions`);
  assert.equal(r405.status, 405);
  assert.equal(r405.headers.get('allow'), 'POST');
  assert.equal((await fetch(`${srv.url}/v1/models`, { method: 'POST', body: '{}' })).status, 405);

  const big = JSON.stringify({ model: MODEL_ID, prompt: 'x'.repeat(2_000_000) });
  const r413 = await postJSON(`${srv.url}/v1/completions`, big);
  assert.equal(r413.status, 413);
  assert.equal(r413.json.error.code, 'request_too_large');

  // All counted by endpoint and status.
  const m = await metrics(srv.url);
  assert.ok(m['switchboard_requests_total{endpoint="/v1/chat/completions",status="400"}'] >= 5);
  assert.ok(m['switchboard_requests_total{endpoint="/v1/completions",status="413"}'] >= 1);
  assert.ok(m['switchboard_requests_total{endpoint="other",status="404"}'] >= 1);
  assert.ok(m['switchboard_requests_total{endpoint="/v1/chat/completions",status="404"}'] >= 1);
  for (const k of ['switchboard_prompt_tokens_total', 'switchboard_generation_tokens_total', 'switchboard_prompt_tokens_cached_total',
    'switchboard_queue_length', 'switchboard_running_sequences', 'switchboard_kv_cache_blocks_used', 'switchboard_kv_cache_blocks',
    'process_resident_memory_bytes', 'switchboard_time_to_first_token_seconds_count', 'switchboard_inter_token_latency_seconds_count'])
    assert.ok(k in m, `metric ${k}`);
  assert.ok(m.switchboard_generation_tokens_total > 0 && m.process_resident_memory_bytes > 0);
  assert.ok(m['switchboard_time_to_first_token_seconds_bucket{le="+Inf"}'] > 0);
});

test('503 with Retry-After when the queue is full', async () => {
  const busy = await startServer(['--threads', '1', '--parallel', '1', '--max-queue', '1']);
  try {
    const body = { model: MODEL_ID, prompt: 'Once upon a time', max_tokens: 200, temperature: 0 };
    const results = await Promise.all(Array.from({ length: 12 }, () => postJSON(`${busy.url}/v1/completions`, body)));
    const statuses = results.map((r) => r.status);
    assert.ok(statuses.includes(503), `statuses ${statuses}`);
    assert.ok(statuses.includes(200), `statuses ${statuses}`);
    assert.ok(statuses.every((s) => s === 200 || s === 503), `statuses ${statuses}`);
    const r503 = results.find((r) => r.status === 503);
    assert.equal(r503.headers.get('retry-after'), '1');
    assert.equal(r503.json.error.code, 'server_busy');
    const c = new OpenAI({ baseURL: `${busy.url}/v1`, apiKey: 'unused', maxRetries: 0 });
    const errs = await Promise.allSettled(Array.from({ length: 6 }, () => c.completions.create(body)));
    assert.ok(errs.some((x) => x.status === 'rejected' && x.reason.status === 503));
  } finally {
    await busy.stop();
  }
});
