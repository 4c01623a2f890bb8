// The gateway's halves together (issue 14, done-when 5; issue 15's "a key
// sees only its own files and batches, and batch tokens count in its
// usage"): two keys send traffic; each key's GET /v1/usage equals the sum of
// the usage fields of its own responses and shows nothing of the other's;
// the admin key's /admin/usage?by=key has both; a key cannot rate another
// key's completion; a key's uploaded file and batch are invisible to the
// other key, and the batch's tokens land in its owner's usage.
import test, { after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { MODEL_ID, postJSON, sleep, startServer } from './lib/harness.mjs';
import { createKey, get } from './lib/gateway.mjs';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sb-gwkeys-'));
after(() => fs.rmSync(dir, { recursive: true, force: true }));

const auth = (key) => ({ headers: { 'content-type': 'application/json', authorization: `Bearer ${key}` } });
const usageOf = async (url, key, query = '') => {
  const r = await get(url, `/v1/usage${query}`, key);
  assert.equal(r.status, 200);
  return (await r.json()).data;
};
const sum = (rows, f) => rows.reduce((a, r) => a + r[f], 0);

test('usage per key, feedback and batches owned by their key, batch tokens in the owner\'s usage', { timeout: 300000 }, async () => {
  const state = path.join(dir, 'state');
  const alice = createKey(state, 'alice');
  const bob = createKey(state, 'bob');
  const root = createKey(state, 'root', ['--admin']);
  const srv = await startServer(['--state-dir', state]);
  try {
    const sent = { alice: { n: 0, prompt: 0, completion: 0, ids: [] }, bob: { n: 0, prompt: 0, completion: 0, ids: [] } };
    for (let i = 0; i < 12; i++) {
      const who = i % 3 === 0 ? 'bob' : 'alice';
      const r = await postJSON(`${srv.url}/v1/completions`,
        { model: MODEL_ID, prompt: `Once ${i}`, max_tokens: 3 + (i % 4), temperature: 0.7 }, auth(who === 'bob' ? bob : alice));
      assert.equal(r.status, 200, r.text);
      const s = sent[who];
      s.n++;
      s.prompt += r.json.usage.prompt_tokens;
      s.completion += r.json.usage.completion_tokens;
      s.ids.push(r.json.id);
    }
    for (const [who, key] of [['alice', alice], ['bob', bob]]) {
      const rows = await usageOf(srv.url, key, '?by=key');
      assert.equal(rows.length, 1, JSON.stringify(rows));
      assert.equal(rows[0].key, who);
      assert.equal(rows[0].requests, sent[who].n);
      assert.equal(rows[0].prompt_tokens, sent[who].prompt);
      assert.equal(rows[0].completion_tokens, sent[who].completion);
    }
    const all = await get(srv.url, '/admin/usage?by=key', root);
    assert.equal(all.status, 200);
    const byKey = Object.fromEntries((await all.json()).data.map((r) => [r.key, r]));
    assert.equal(byKey.alice.requests, sent.alice.n);
    assert.equal(byKey.bob.requests, sent.bob.n);
    assert.equal((await get(srv.url, '/admin/usage', alice)).status, 403, 'not an admin key');
    assert.equal((await get(srv.url, '/v1/usage')).status, 401, 'keys exist: a key is required');

    // Feedback: one's own completion only; another key's id is as unknown as a made-up one.
    const own = await postJSON(`${srv.url}/v1/feedback`, { id: sent.alice.ids[0], rating: 1 }, auth(alice));
    assert.equal(own.status, 200, own.text);
    const other = await postJSON(`${srv.url}/v1/feedback`, { id: sent.alice.ids[1], rating: -1 }, auth(bob));
    assert.equal(other.status, 404, other.text);

    // Files and batches: alice's are hers alone.
    const lines = [0, 1, 2, 3].map((i) => JSON.stringify({
      custom_id: `r${i}`, method: 'POST', url: '/v1/completions',
      body: { model: MODEL_ID, prompt: `Batch ${i}`, max_tokens: 4, temperature: 0 },
    })).join('\n') + '\n';
    const form = new FormData();
    form.append('purpose', 'batch');
    form.append('file', new Blob([lines], { type: 'application/jsonl' }), 'in.jsonl');
    const up = await fetch(`${srv.url}/v1/files`, { method: 'POST', body: form, headers: { authorization: `Bearer ${alice}` } });
    assert.equal(up.status, 200, await up.clone().text());
    const file = await up.json();
    assert.equal((await get(srv.url, `/v1/files/${file.id}`, bob)).status, 404);
    assert.equal((await (await get(srv.url, '/v1/files', bob)).json()).data.length, 0);
    const anonymous = new FormData();
    anonymous.append('purpose', 'batch');
    anonymous.append('file', new Blob([lines]), 'in.jsonl');
    assert.equal((await fetch(`${srv.url}/v1/files`, { method: 'POST', body: anonymous })).status, 401, 'no key, no upload');

    const created = await postJSON(`${srv.url}/v1/batches`,
      { input_file_id: file.id, endpoint: '/v1/completions', completion_window: '24h' }, auth(alice));
    assert.equal(created.status, 200, created.text);
    const id = created.json.id;
    assert.equal((await get(srv.url, `/v1/batches/${id}`, bob)).status, 404);
    const byBob = await postJSON(`${srv.url}/v1/batches`,
      { input_file_id: file.id, endpoint: '/v1/completions', completion_window: '24h' }, auth(bob));
    assert.equal(byBob.status, 404, 'bob cannot use alice\'s file');
    let batch;
    for (let i = 0; i < 600; i++) {
      batch = await (await get(srv.url, `/v1/batches/${id}`, alice)).json();
      if (['completed', 'failed', 'cancelled', 'expired'].includes(batch.status)) break;
      await sleep(100);
    }
    assert.equal(batch.status, 'completed', JSON.stringify(batch));
    assert.equal(batch.request_counts.completed, 4);
    const output = await (await get(srv.url, `/v1/files/${batch.output_file_id}/content`, alice)).text();
    const results = output.trim().split('\n').map((l) => JSON.parse(l));
    const batchCompletion = results.reduce((a, r) => a + r.response.body.usage.completion_tokens, 0);
    // The batch's requests are alice's: her usage grew by exactly them; bob's did not move.
    const after = await usageOf(srv.url, alice, '?by=key');
    assert.equal(after[0].requests, sent.alice.n + 4);
    assert.equal(after[0].completion_tokens, sent.alice.completion + batchCompletion);
    assert.equal((await usageOf(srv.url, bob, '?by=key'))[0].requests, sent.bob.n);
    assert.ok(sum(await usageOf(srv.url, alice), 'requests') === sent.alice.n + 4);
  } finally {
    await srv.stop();
  }
});
