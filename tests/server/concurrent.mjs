// 16 concurrent streaming clients with prompts of different lengths: each
// greedy answer must equal the same request's answer when it ran alone
// (batch invariance through the whole server: scheduling, batching, SSE).
import { test, after, before } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, readSSE, MODEL_ID } from './lib/harness.mjs';

let srv;
before(async () => {
  srv = await startServer(['--threads', '2', '--parallel', '16']);
});
after(async () => srv && (await srv.stop()));

const story =
  'Once upon a time there was a little girl named Lily who lived in a small house near the woods. ' +
  'Every morning she walked to the river with her dog Max to look at the fish and the ducks. ' +
  'One day she found a shiny stone under a big tree and wanted to show it to her mom.';
const words = story.split(' ');
const prompts = Array.from({ length: 16 }, (_, i) => words.slice(0, 2 + i * 3).join(' '));

async function streamOne(i, chat) {
  const body = chat
    ? { model: MODEL_ID, messages: [{ role: 'user', content: prompts[i] }], max_tokens: 40 + i, temperature: 0, stream: true }
    : { model: MODEL_ID, prompt: prompts[i], max_tokens: 40 + i, temperature: 0, stream: true };
  const r = await fetch(`${srv.url}/v1/${chat ? 'chat/completions' : 'completions'}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  assert.equal(r.status, 200);
  assert.match(r.headers.get('content-type'), /text\/event-stream/);
  const { chunks, done } = await readSSE(r);
  assert.ok(done, 'stream ended with [DONE]');
  let text = '';
  let finish = null;
  for (const c of chunks)
    for (const ch of c.choices) {
      text += chat ? ch.delta.content ?? '' : ch.text;
      finish = ch.finish_reason ?? finish;
    }
  return { text, finish };
}

for (const chat of [false, true]) {
  test(`${chat ? 'chat' : 'completions'}: 16 concurrent streams equal their solo runs`, async () => {
    const alone = [];
    for (let i = 0; i < prompts.length; i++) alone.push(await streamOne(i, chat));
    for (let round = 0; round < 2; round++) {
      const together = await Promise.all(prompts.map((_, i) => streamOne(i, chat)));
      for (let i = 0; i < prompts.length; i++) {
        assert.equal(together[i].text, alone[i].text, `prompt ${i}, round ${round}`);
        assert.equal(together[i].finish, alone[i].finish, `prompt ${i}, round ${round}`);
      }
    }
  });
}
