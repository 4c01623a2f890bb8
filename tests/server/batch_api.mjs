// The Files and Batch APIs through the official openai client against
// `switchboard serve --state-dir`: a real multipart upload, the file's
// object and content, bad uploads (wrong purpose, not JSONL, too large),
// a batch to completion with its output and error files, listing with a
// cursor, cancelling, deleting, and a server SIGKILLed in the middle of a
// batch and started again on the same state directory: the batch
// completes and its output has each custom_id once.
import { test, after, before } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import OpenAI, { toFile } from 'openai';
import { startServer, genModel, sleep } from './lib/harness.mjs';

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'batch-api-'));
const model = genModel(path.join(tmp, 'm.gguf'), { seed: 5 });
const state = path.join(tmp, 'state');
const serverArgs = ['--threads', '2', '--state-dir', state, '--max-file-bytes', '400000', '--parallel', '4'];
let srv, client;

function connect(s) {
  return new OpenAI({ baseURL: `${s.url}/v1`, apiKey: 'unused', maxRetries: 0 });
}

before(async () => {
  srv = await startServer(serverArgs, { model });
  client = connect(srv);
});
after(async () => {
  if (srv) await srv.stop();
  fs.rmSync(tmp, { recursive: true, force: true });
});

// n completion requests "p0".."p{n-1}"; `bad` adds a bad JSON line and one for another endpoint.
function jsonl(n, { maxTokens = 4, bad = false, prefix = 'p' } = {}) {
  const lines = [];
  for (let i = 0; i < n; i++)
    lines.push(JSON.stringify({ custom_id: `${prefix}${i}`, method: 'POST', url: '/v1/completions',
      body: { model: 'm', prompt: `Story ${i}`, max_tokens: maxTokens, temperature: 0 } }));
  if (bad) {
    lines.splice(3, 0, '{"custom_id": "broken", ');
    lines.push(JSON.stringify({ custom_id: 'other-url', method: 'POST', url: '/v1/embeddings', body: { model: 'm', input: 'x' } }));
  }
  return lines.join('\n') + '\n';
}

async function upload(text, name = 'in.jsonl', purpose = 'batch') {
  return client.files.create({ file: await toFile(Buffer.from(text), name), purpose });
}

async function waitFor(id, statuses, limitMs = 120000) {
  const deadline = Date.now() + limitMs;
  for (;;) {
    const b = await client.batches.retrieve(id);
    if (statuses.includes(b.status)) return b;
    if (Date.now() > deadline) throw new Error(`batch ${id} still ${b.status}`);
    await sleep(50);
  }
}

const lines = async (fileId) => (await (await client.files.content(fileId)).text()).split('\n').filter(Boolean).map((l) => JSON.parse(l));

test('upload a file: its object, the list, its content', async () => {
  const text = jsonl(5);
  const f = await upload(text, 'five.jsonl');
  assert.match(f.id, /^file-[0-9a-f]{24}$/);
  assert.equal(f.object, 'file');
  assert.equal(f.bytes, Buffer.byteLength(text));
  assert.equal(f.filename, 'five.jsonl');
  assert.equal(f.purpose, 'batch');
  assert.equal(typeof f.created_at, 'number');
  const again = await client.files.retrieve(f.id);
  assert.deepEqual(again, f);
  const list = await client.files.list();
  assert.ok(list.data.some((x) => x.id === f.id));
  assert.equal(await (await client.files.content(f.id)).text(), text);
  const del = await client.files.delete(f.id);
  assert.deepEqual(del, { id: f.id, object: 'file', deleted: true });
  await assert.rejects(client.files.retrieve(f.id), (e) => e.status === 404);
});

test('bad uploads get clear errors', async () => {
  await assert.rejects(upload(jsonl(2), 'x.jsonl', 'fine-tune'),
    (e) => e.status === 400 && /purpose 'fine-tune' is not supported/.test(e.message));
  await assert.rejects(upload('a,b,c\n1,2,3\n', 'x.csv'),
    (e) => e.status === 400 && /not JSONL.*line 1/.test(e.message));
  await assert.rejects(upload('', 'empty.jsonl'), (e) => e.status === 400 && /empty/.test(e.message));
  await assert.rejects(upload('x'.repeat(500000), 'big.jsonl'),
    (e) => e.status === 413 && /--max-file-bytes/.test(e.message));
  const raw = await fetch(`${srv.url}/v1/files`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{}' });
  assert.equal(raw.status, 400);
  assert.match((await raw.json()).error.message, /multipart\/form-data/);
  const two = new FormData();
  two.append('purpose', 'batch');
  two.append('file', new Blob([jsonl(1)]), 'a.jsonl');
  two.append('file', new Blob([jsonl(1)]), 'b.jsonl');
  const r2 = await fetch(`${srv.url}/v1/files`, { method: 'POST', body: two });
  assert.equal(r2.status, 400);
  assert.match((await r2.json()).error.message, /more than one file/);
  // Nothing of those became a file, and no temporary file stayed behind.
  const names = fs.readdirSync(path.join(state, 'files'));
  assert.ok(!names.some((n) => n.endsWith('.tmp')), names.join(' '));
});

test('a batch runs to completion: output and error files, counts, metadata', async () => {
  const f = await upload(jsonl(40, { bad: true }));
  await assert.rejects(client.batches.create({ input_file_id: f.id, endpoint: '/v1/images', completion_window: '24h' }),
    (e) => e.status === 400 && e.param === 'endpoint');
  await assert.rejects(client.batches.create({ input_file_id: 'file-nope', endpoint: '/v1/completions', completion_window: '24h' }),
    (e) => e.status === 404);
  const b = await client.batches.create({ input_file_id: f.id, endpoint: '/v1/completions', completion_window: '24h',
    metadata: { run: 'one' } });
  assert.match(b.id, /^batch_/);
  assert.equal(b.object, 'batch');
  assert.equal(b.input_file_id, f.id);
  assert.ok(['validating', 'in_progress', 'finalizing', 'completed'].includes(b.status), b.status);
  assert.deepEqual(b.metadata, { run: 'one' });
  const done = await waitFor(b.id, ['completed', 'failed']);
  assert.equal(done.status, 'completed');
  assert.deepEqual(done.request_counts, { total: 42, completed: 40, failed: 2 });
  for (const k of ['in_progress_at', 'finalizing_at', 'completed_at', 'expires_at']) assert.equal(typeof done[k], 'number', k);
  const out = await lines(done.output_file_id);
  assert.deepEqual(out.map((o) => o.custom_id), Array.from({ length: 40 }, (_, i) => `p${i}`));
  for (const o of out) {
    assert.equal(o.response.status_code, 200);
    assert.equal(o.response.body.object, 'text_completion');
    assert.equal(o.error, null);
  }
  const errs = await lines(done.error_file_id);
  assert.deepEqual(errs.map((o) => o.error.code), ['invalid_json', 'mismatched_url']);
  assert.equal(errs[1].custom_id, 'other-url');
  const outFile = await client.files.retrieve(done.output_file_id);
  assert.equal(outFile.purpose, 'batch_output');
});

test('listing batches pages with limit and after', async () => {
  const f = await upload(jsonl(3, { prefix: 'l' }));
  const ids = [];
  for (let i = 0; i < 3; i++)
    ids.push((await client.batches.create({ input_file_id: f.id, endpoint: '/v1/completions', completion_window: '24h' })).id);
  const page = await client.batches.list({ limit: 2 });
  assert.deepEqual(page.data.map((b) => b.id), [ids[2], ids[1]]);
  assert.equal(page.has_more, true);
  const next = await client.batches.list({ limit: 2, after: ids[1] });
  assert.equal(next.data[0].id, ids[0]);
  for (const id of ids) await waitFor(id, ['completed']);
});

test('cancelling a batch stops it; what was done is in its output', async () => {
  const f = await upload(jsonl(400, { maxTokens: 24, prefix: 'c' }));
  const b = await client.batches.create({ input_file_id: f.id, endpoint: '/v1/completions', completion_window: '24h' });
  await sleep(100);
  const c = await client.batches.cancel(b.id);
  assert.ok(['cancelling', 'cancelled'].includes(c.status), c.status);
  const done = await waitFor(b.id, ['cancelled']);
  assert.equal(typeof done.cancelling_at, 'number');
  assert.equal(typeof done.cancelled_at, 'number');
  assert.ok(done.request_counts.completed < 400, JSON.stringify(done.request_counts));
  if (done.request_counts.completed > 0) {
    const out = await lines(done.output_file_id);
    assert.equal(out.length, done.request_counts.completed);
  }
  await assert.rejects(client.batches.cancel(b.id).then((x) => { if (x.status !== 'cancelled') throw new Error(x.status); throw { status: 200 }; }),
    (e) => e.status === 200);
  const finished = (await client.batches.list({ limit: 100 })).data.find((x) => x.status === 'completed');
  await assert.rejects(client.batches.cancel(finished.id), (e) => e.status === 409 && /completed/.test(e.message));
});

test('a server killed mid-batch continues it after a restart', async () => {
  const n = 300;
  const f = await upload(jsonl(n, { maxTokens: 48, prefix: 'r' }));
  const b = await client.batches.create({ input_file_id: f.id, endpoint: '/v1/completions', completion_window: '24h' });
  let seen;
  for (;;) {
    seen = await client.batches.retrieve(b.id);
    if (seen.request_counts.completed > 0 || seen.status === 'completed') break;
    await sleep(10);
  }
  assert.equal(seen.status, 'in_progress', 'killed while it runs');
  assert.ok(seen.request_counts.completed < n);
  srv.proc.kill('SIGKILL');
  await new Promise((r) => srv.proc.once('exit', r));
  srv = await startServer(serverArgs, { model });
  client = connect(srv);
  const done = await waitFor(b.id, ['completed', 'failed']);
  assert.equal(done.status, 'completed');
  assert.deepEqual(done.request_counts, { total: n, completed: n, failed: 0 });
  const out = await lines(done.output_file_id);
  const ids = out.map((o) => o.custom_id);
  assert.equal(new Set(ids).size, n, 'each custom_id once');
  assert.deepEqual(ids, Array.from({ length: n }, (_, i) => `r${i}`));
});
