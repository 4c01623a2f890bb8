// `switchboard batch` durability: a 1,000-request input (with bad lines)
// run once uninterrupted for the reference, then in a fresh state directory
// SIGKILLed at random moments (during start-up too) and rerun until it
// completes. The output must equal the reference byte for byte except the
// bodies' "created" (the second each answer was made) and their
// usage.prompt_tokens_details.cached_tokens (how much of the prompt the
// prefix cache held depends on what ran just before), hold every
// custom_id once, keep the bad lines as error lines, and the state must
// have recorded each request's result exactly once (nothing recorded done
// was computed again). A changed input under the same state is refused.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { BIN, genModel, sleep } from './lib/harness.mjs';

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'batch-cli-'));
const model = genModel(path.join(tmp, 'm.gguf'), { seed: 3 });
const N = 1000;

// The input: mostly short greedy completions and chats, and bad lines at known places.
const lines = [];
const bad = new Map(); // line number (1-based) -> expected error code, or 400 for a body the endpoint refuses
for (let i = 0; i < N; i++) {
  const ln = i + 1;
  if (i % 97 === 13) {
    lines.push(`{"custom_id": "req-${i}", "method": "POST", "url": "/v1/completions", "body": {`);
    bad.set(ln, 'invalid_json');
  } else if (i % 97 === 40) {
    lines.push(JSON.stringify({ custom_id: `req-${i}`, method: 'POST', url: '/v1/images', body: {} }));
    bad.set(ln, 'invalid_url');
  } else if (i % 97 === 61) {
    lines.push(JSON.stringify({ custom_id: `req-${i}`, method: 'POST', url: '/v1/completions', body: 'hello' }));
    bad.set(ln, 'invalid_body');
  } else if (i % 97 === 77) {
    lines.push(JSON.stringify({ custom_id: `req-${i}`, method: 'POST', url: '/v1/completions',
      body: { model: 'm', prompt: 'x', max_tokens: -3 } }));
    bad.set(ln, 400);
  } else if (i % 97 === 90) {
    lines.push(JSON.stringify({ method: 'POST', url: '/v1/completions', body: { model: 'm', prompt: 'x' } }));
    bad.set(ln, 'missing_custom_id');
  } else if (i % 3 === 0) {
    lines.push(JSON.stringify({ custom_id: `req-${i}`, method: 'POST', url: '/v1/chat/completions',
      body: { model: 'm', messages: [{ role: 'user', content: `question ${i}` }], max_tokens: 4 + (i % 5), temperature: 0 } }));
  } else {
    lines.push(JSON.stringify({ custom_id: `req-${i}`, method: 'POST', url: '/v1/completions',
      body: { model: 'm', prompt: `Once upon a time ${i}`, max_tokens: 3 + (i % 7), temperature: 0 } }));
  }
}
const input = path.join(tmp, 'in.jsonl');
fs.writeFileSync(input, lines.join('\n') + '\n');
const runnable = N - [...bad.values()].filter((v) => v !== 400).length;

function args(out, state) {
  return ['batch', input, '-o', out, '-m', model, '--state-dir', state, '--parallel', '8', '--threads', '2'];
}

function runToEnd(out, state) {
  const r = spawnSync(BIN, args(out, state), { encoding: 'utf8', timeout: 120000 });
  assert.equal(r.status, 0, `batch failed (${r.status ?? r.signal}):\n${r.stderr}`);
  return r.stderr;
}

// The output with each body's "created" (the one run-specific field) blanked.
function normalized(file) {
  return fs.readFileSync(file, 'utf8').split('\n').filter(Boolean).map((l) => {
    const o = JSON.parse(l);
    if (o.response?.body?.created !== undefined) o.response.body.created = 0;
    if (o.response?.body?.usage?.prompt_tokens_details) o.response.body.usage.prompt_tokens_details.cached_tokens = 0;
    return JSON.stringify(o);
  });
}

test('a batch killed at random moments resumes to the uninterrupted output', { timeout: 600000 }, async () => {
  const ref = path.join(tmp, 'ref.jsonl');
  const t0 = Date.now();
  runToEnd(ref, path.join(tmp, 'ref.state'));
  const refMs = Date.now() - t0;
  const refLines = normalized(ref);
  assert.equal(refLines.length, N, 'one output line per input line');

  // Every custom_id once; bad lines are error lines of the right kind, at their line.
  const seen = new Set();
  refLines.forEach((l, i) => {
    const o = JSON.parse(l);
    const want = bad.get(i + 1);
    assert.match(o.id, /^batch_req_[0-9a-f]{24}$/);
    if (o.custom_id !== null) {
      assert.ok(!seen.has(o.custom_id), `${o.custom_id} twice`);
      seen.add(o.custom_id);
    }
    if (want === undefined) {
      assert.equal(o.error, null, l);
      assert.equal(o.response.status_code, 200, l);
      assert.ok(o.response.body.usage.completion_tokens > 0, l);
    } else if (want === 400) {
      assert.equal(o.response.status_code, 400, l);
      assert.equal(o.response.body.error.param, 'max_tokens', l);
    } else {
      assert.equal(o.response, null, l);
      assert.equal(o.error.code, want, l);
      assert.equal(o.error.line, i + 1, l);
      assert.match(o.error.message, new RegExp(`^line ${i + 1}: `));
    }
  });
  assert.equal(seen.size, N - [...bad.values()].filter((v) => v === 'missing_custom_id' || v === 'invalid_json').length);

  // Killed again and again, at random moments: some during start-up, the rest while it works.
  const out = path.join(tmp, 'out.jsonl');
  const state = path.join(tmp, 'kill.state');
  let kills = 0;
  const doneAtStart = []; // what each run found recorded: it grows while runs are killed mid-work
  for (let attempt = 0; attempt < 12 && kills < 6; attempt++) {
    const early = attempt < 2;
    // Each kill lands within the first eighth of an uninterrupted run's time (start-up
    // included), so six of them cannot finish the job before the last one lands.
    const delay = early ? Math.random() * 30 : 20 + Math.random() * Math.max(60, refMs / 8);
    const child = spawn(BIN, args(out, state), { stdio: ['ignore', 'ignore', 'pipe'] });
    let err = '';
    child.stderr.on('data', (d) => (err += d));
    const exited = new Promise((resolve) => child.on('exit', (code, sig) => resolve({ code, sig })));
    await sleep(delay);
    child.kill('SIGKILL');
    const { code, sig } = await exited;
    const started = /requests, (\d+) done/.exec(err);
    if (started) doneAtStart.push(Number(started[1]));
    if (sig === 'SIGKILL') kills++;
    else assert.equal(code, 0, 'a run that was not killed completed');
    if (code === 0) break; // it finished before the kill: the job is complete
  }
  assert.ok(kills >= 4, `only ${kills} runs were killed`);
  const last = runToEnd(out, state);
  const resumed = /requests, (\d+) done/.exec(last);
  doneAtStart.push(Number(resumed[1]));
  console.log(`# kills: ${kills}; done at each start: ${doneAtStart.join(' ')}`);
  assert.ok(doneAtStart.some((d) => d > 0 && d < N), `no run was killed mid-work: ${doneAtStart.join(' ')}`);
  assert.deepEqual(normalized(out), refLines, 'the resumed output equals the uninterrupted one');
  const m = /; (\d+) computations recorded in all/.exec(last);
  assert.ok(m, last);
  assert.equal(Number(m[1]), runnable, 'each runnable request was recorded exactly once');

  // Run again on the completed state: nothing computed, same output.
  const again = runToEnd(out, state);
  assert.match(again, /computed 0 this run/);
  assert.deepEqual(normalized(out), refLines);

  // A changed input under the same state is refused, naming both.
  fs.appendFileSync(input, JSON.stringify({ custom_id: 'extra', method: 'POST', url: '/v1/completions', body: {} }) + '\n');
  const r = spawnSync(BIN, args(out, state), { encoding: 'utf8' });
  assert.notEqual(r.status, 0);
  assert.match(r.stderr, /the input changed/);
  assert.match(r.stderr, /sha256/);
});

test.after(() => fs.rmSync(tmp, { recursive: true, force: true }));
