// Requests that share a long system prompt: the shared prefix is computed
// once and then reused from the KV cache, as /metrics shows (prompt tokens
// cached grows by about the shared part per request; prompt tokens computed
// grows only by the part that differs).
import { test, after, before } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { startServer, postJSON, metrics, BIN, MODEL, MODEL_ID } from './lib/harness.mjs';

let srv;
before(async () => {
  srv = await startServer(['--threads', '2']);
});
after(async () => srv && (await srv.stop()));

const system =
  'You are a storyteller for small children. Your stories are short and kind, they have a ' +
  'happy ending, and they are about animals that live in the forest near a little village. ' +
  'Every story has a dog, a cat and a bird who are good friends and help each other.';
const BLOCK = 16; // the engine's default block size: sharing is per whole block

test('a shared system prompt is computed once', async () => {
  // Tokens of the part every request shares (BOS + the rendered system turn).
  const shared = JSON.parse(
    execFileSync(BIN, ['tokenize', '-m', MODEL, '--special', `<|im_start|>system\n${system}<|im_end|>\n<|im_start|>user\n`]),
  ).length;
  assert.ok(shared > 100, `shared prefix is ${shared} tokens`);
  const ask = (q) =>
    postJSON(`${srv.url}/v1/chat/completions`, {
      model: MODEL_ID,
      messages: [{ role: 'system', content: system }, { role: 'user', content: q }],
      max_tokens: 8,
      temperature: 0,
    });
  const first = await ask('Tell me a story about the dog.');
  assert.equal(first.status, 200);
  const m0 = await metrics(srv.url);
  const questions = ['What does the cat like?', 'Where does the bird sleep?', 'Who is the oldest friend?', 'Sing a song.'];
  let prev = m0;
  for (const q of questions) {
    const r = await ask(q);
    assert.equal(r.status, 200);
    const m = await metrics(srv.url);
    const cached = m.switchboard_prompt_tokens_cached_total - prev.switchboard_prompt_tokens_cached_total;
    const computed = m.switchboard_prompt_tokens_computed_total - prev.switchboard_prompt_tokens_computed_total;
    const n = r.json.usage.prompt_tokens;
    assert.ok(cached >= shared - BLOCK, `'${q}': ${cached} cached of ${shared} shared`);
    assert.ok(computed <= n - (shared - BLOCK), `'${q}': ${computed} computed of ${n}, ${shared} shared`);
    assert.equal(r.json.usage.prompt_tokens_details.cached_tokens, cached);
    prev = m;
  }
  // In all, the shared part was computed about once, not once per request.
  const total = prev.switchboard_prompt_tokens_computed_total - m0.switchboard_prompt_tokens_computed_total;
  assert.ok(total < questions.length * (shared - BLOCK), `computed ${total} for ${questions.length} requests`);
});
