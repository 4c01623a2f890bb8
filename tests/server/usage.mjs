// Usage, cost, the request log and feedback (issue 14, accounting half):
// what GET /v1/usage, GET /admin/usage and `switchboard usage` report
// equals the sum of the `usage` fields of the responses this test received,
// per served model and per A/B arm, cached tokens and cache hits included;
// cost follows the registry's prices; feedback is counted against the model
// that answered; the request log has one complete line per request, rotates
// by size and holds prompts only with --log-prompts; a corrupt or locked
// usage.db is a clear log line while the server keeps serving.
//
// Keys (the admission half) are not on this branch yet: every request here
// is anonymous, so "per key" is the anonymous key "" (by=key shows one row).
import test, { after, before } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startServer, postJSON, readSSE, sleep, genModel, BIN } from './lib/harness.mjs';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sb-usage-'));
after(() => fs.rmSync(dir, { recursive: true, force: true }));

const prices = { a: { prompt: 1.5, completion: 6 }, b: { prompt: 0.5, completion: 2 } };
let registry;
before(() => {
  genModel(path.join(dir, 'a.gguf'), { seed: 21 });
  genModel(path.join(dir, 'b.gguf'), { seed: 22 });
  registry = path.join(dir, 'models.json');
  fs.writeFileSync(registry, JSON.stringify({
    models: ['a', 'b'].map((n) => ({ name: n, path: `${n}.gguf`, device: 'cpu', price: prices[n] })),
    routes: [{ name: 'ab', split: [{ model: 'a', weight: 50 }, { model: 'b', weight: 50 }] }],
  }));
});

const getJSON = async (url) => {
  const r = await fetch(url);
  return { status: r.status, json: await r.json() };
};

async function streamUsage(url, endpoint, body) {
  const r = await fetch(`${url}${endpoint}`, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ ...body, stream: true, stream_options: { include_usage: true } }),
  });
  assert.equal(r.status, 200);
  const hit = r.headers.get('x-switchboard-cache') === 'hit';
  const { chunks, done } = await readSSE(r);
  assert.ok(done);
  const last = chunks.at(-1);
  return { id: chunks[0].id, model: chunks[0].model, usage: last.usage, hit };
}

// Sends a mix (chat and completions, streamed and whole, repeated so that
// some are cache hits) through the route; returns what the responses said.
async function traffic(url) {
  const got = [];
  for (let i = 0; i < 24; i++) {
    const user = `u${i % 6}`;
    const deterministic = i % 3 !== 2;
    const sampling = deterministic ? { temperature: 0 } : { temperature: 0.8 };
    if (i % 4 === 0) {
      got.push(await streamUsage(url, '/v1/chat/completions', {
        model: 'ab', user, messages: [{ role: 'user', content: `story ${i % 5}` }], max_tokens: 6 + (i % 3), ...sampling,
      }));
    } else {
      const r = await postJSON(`${url}/v1/completions`, {
        model: 'ab', user, prompt: `Once ${i % 4}`, max_tokens: 5 + (i % 2), n: 1 + (i % 2), ...sampling,
      });
      assert.equal(r.status, 200, r.text);
      got.push({ id: r.json.id, model: r.json.model, usage: r.json.usage, hit: r.headers.get('x-switchboard-cache') === 'hit' });
    }
  }
  return got;
}

function expected(got) {
  const by = {};
  for (const g of got) {
    const e = (by[g.model] ??= { requests: 0, prompt_tokens: 0, completion_tokens: 0, cached_tokens: 0, cache_hits: 0, cost: 0 });
    e.requests++;
    e.prompt_tokens += g.usage.prompt_tokens;
    e.completion_tokens += g.usage.completion_tokens;
    e.cached_tokens += g.usage.prompt_tokens_details.cached_tokens;
    e.cache_hits += g.hit ? 1 : 0;
    if (!g.hit) e.cost += (g.usage.prompt_tokens * prices[g.model].prompt + g.usage.completion_tokens * prices[g.model].completion) / 1e6;
  }
  return by;
}

const pick = (row) => ({ requests: row.requests, prompt_tokens: row.prompt_tokens, completion_tokens: row.completion_tokens,
  cached_tokens: row.cached_tokens, cache_hits: row.cache_hits });

test('usage equals the sum of the responses\' usage, per model and arm; cost; feedback per model; the CLI agrees', async () => {
  const state = path.join(dir, 'state1');
  const srv = await startServer(['--cache', 'memory', '--state-dir', state], { registry });
  try {
    const got = await traffic(srv.url);
    assert.ok(got.some((g) => g.hit) && got.some((g) => !g.hit), 'both hits and misses');
    assert.ok(got.some((g) => g.model === 'a') && got.some((g) => g.model === 'b'), 'both arms served');
    const want = expected(got);

    const mine = await getJSON(`${srv.url}/v1/usage`);
    assert.equal(mine.status, 200, JSON.stringify(mine.json));
    assert.equal(mine.json.data.length, 2, JSON.stringify(mine.json));
    for (const row of mine.json.data) {
      assert.equal(row.route, 'ab', 'the arm of route ab');
      assert.deepEqual(pick(row), pick(want[row.model]), `model ${row.model}`);
      assert.ok(Math.abs(row.cost - want[row.model].cost) < 1e-9, `cost of ${row.model}: ${row.cost} vs ${want[row.model].cost}`);
      assert.equal(row.errors, 0);
      assert.ok(row.latency_ms_mean > 0);
    }
    const admin = await getJSON(`${srv.url}/admin/usage?by=key`);
    assert.equal(admin.json.data.length, 1);
    assert.equal(admin.json.data[0].key, '', 'anonymous');
    assert.equal(admin.json.data[0].requests, got.length);
    const today = new Date().toISOString().slice(0, 10);
    const day = await getJSON(`${srv.url}/v1/usage?by=day&since=${today}`);
    assert.equal(day.json.data[0].day, today);
    assert.equal(day.json.data[0].requests, got.length);
    assert.equal((await getJSON(`${srv.url}/v1/usage?since=2999-01-01`)).json.data.length, 0);
    assert.equal((await getJSON(`${srv.url}/v1/usage?by=color`)).status, 400);
    assert.equal((await getJSON(`${srv.url}/v1/usage?since=yesterday`)).status, 400);

    // Feedback: +1 for a's answers, -1 for b's (one of b's rated twice: the second replaces the first).
    const rate = (id, rating, extra = {}) => postJSON(`${srv.url}/v1/feedback`, { id, rating, ...extra });
    for (const g of got) {
      const r = await rate(g.id, g.model === 'a' ? 1 : -0.5, { comment: 'ok' });
      assert.equal(r.status, 200, r.text);
      assert.equal(r.json.model, g.model);
    }
    const bId = got.find((g) => g.model === 'b').id;
    assert.equal((await rate(bId, -1)).status, 200);
    const rated = Object.fromEntries((await getJSON(`${srv.url}/v1/usage?by=model`)).json.data.map((r) => [r.model, r]));
    const count = (m) => got.filter((g) => g.model === m).length;
    assert.equal(rated.a.rating_count, count('a'));
    assert.equal(rated.a.rating_mean, 1);
    assert.equal(rated.b.rating_count, count('b'));
    assert.ok(Math.abs(rated.b.rating_mean - (-0.5 * (count('b') - 1) - 1) / count('b')) < 1e-9, JSON.stringify(rated.b));

    // Bad feedback: the field is named; an unknown id is 404.
    const bad = [
      ['not json', null], [{ rating: 1 }, 'id'], [{ id: 5, rating: 1 }, 'id'], [{ id: bId }, 'rating'],
      [{ id: bId, rating: 'good' }, 'rating'], [{ id: bId, rating: 2 }, 'rating'], [{ id: bId, rating: 1, comment: 7 }, 'comment'],
    ];
    for (const [body, param] of bad) {
      const r = await postJSON(`${srv.url}/v1/feedback`, body);
      assert.equal(r.status, 400, `${JSON.stringify(body)}: ${r.text}`);
      assert.equal(r.json.error.param, param, r.text);
    }
    const unknown = await rate('chatcmpl-nosuchthing', 1);
    assert.equal(unknown.status, 404);
    assert.match(unknown.json.error.message, /no completion has the id 'chatcmpl-nosuchthing'/);
  } finally {
    await srv.stop();
  }
  // The CLI reads the same file.
  const cli = spawnSync(BIN, ['usage', '--state-dir', state, '--by', 'model'], { encoding: 'utf8' });
  assert.equal(cli.status, 0, cli.stderr);
  const lines = cli.stdout.trim().split('\n');
  assert.match(lines[0], /^MODEL\s+ROUTE\s+REQUESTS\s+PROMPT\s+COMPLETION\s+CACHED\s+HITS\s+ERRORS\s+LAT_MS\s+TTFT_MS\s+COST\s+RATING\s+RATINGS$/);
  assert.equal(lines.length, 3);
  assert.match(lines[1], /^a\s+ab\s+\d+/);
  assert.match(lines[1], /\+1\.00\s+\d+$/);
  const bad = spawnSync(BIN, ['usage', '--state-dir', state, '--by', 'color'], { encoding: 'utf8' });
  assert.equal(bad.status, 2);
  assert.match(bad.stderr, /--by 'color' is not model, key or day/);
});

test('errors are counted; without --state-dir usage answers 404 saying how to turn it on', async () => {
  const state = path.join(dir, 'state2');
  let srv = await startServer(['--state-dir', state, '--ctx', '64'], { registry });
  try {
    const ok = await postJSON(`${srv.url}/v1/completions`, { model: 'a', prompt: 'Once', max_tokens: 3 });
    assert.equal(ok.status, 200);
    // A prompt longer than the context: routed to a, refused by its engine.
    const long = await postJSON(`${srv.url}/v1/completions`, { model: 'a', prompt: Array(80).fill(7), max_tokens: 3 });
    assert.equal(long.status, 400, long.text);
    const row = (await getJSON(`${srv.url}/v1/usage`)).json.data.find((r) => r.model === 'a');
    assert.equal(row.requests, 2);
    assert.equal(row.errors, 1);
    assert.equal(row.prompt_tokens, ok.json.usage.prompt_tokens);
  } finally {
    await srv.stop();
  }
  srv = await startServer([], { registry });
  try {
    const r = await getJSON(`${srv.url}/v1/usage`);
    assert.equal(r.status, 404);
    assert.match(r.json.error.message, /--state-dir/);
  } finally {
    await srv.stop();
  }
});

test('the request log: one complete line per request, rotated by size, prompts only with --log-prompts', async () => {
  const log = path.join(dir, 'req.log');
  let srv = await startServer(['--cache', 'memory', '--request-log', log, '--request-log-max-bytes', '3000'], { registry });
  let n = 0;
  try {
    for (let i = 0; i < 30; i++, n++) {
      const r = await postJSON(`${srv.url}/v1/completions`, { model: 'ab', user: `u${i}`, prompt: `Once ${i % 10}`, max_tokens: 4, temperature: 0 });
      assert.equal(r.status, 200);
    }
  } finally {
    await srv.stop();
  }
  const files = [log, `${log}.1`, `${log}.2`, `${log}.3`];
  for (const f of files) assert.ok(fs.existsSync(f), `${f} exists (rotated)`);
  assert.ok(!fs.existsSync(`${log}.4`), 'three old files are kept, no more');
  const lines = files.flatMap((f) => fs.readFileSync(f, 'utf8').split('\n').filter(Boolean)).map((l) => JSON.parse(l));
  for (const f of files) assert.ok(fs.statSync(f).size <= 3000, `${f}: ${fs.statSync(f).size} bytes`);
  assert.ok(lines.length >= 10 && lines.length <= n, `${lines.length} lines kept`);
  for (const l of lines) {
    for (const k of ['time', 'request_id', 'id', 'key', 'tier', 'model_requested', 'model', 'status', 'prompt_tokens',
      'completion_tokens', 'cached_tokens', 'ttft_ms', 'latency_ms', 'cache'])
      assert.ok(k in l, `${k} in ${JSON.stringify(l)}`);
    assert.equal(l.model_requested, 'ab');
    assert.ok(['a', 'b'].includes(l.model));
    assert.equal(l.status, 200);
    assert.ok(['hit', 'miss'].includes(l.cache));
    assert.equal(l.completion_tokens, 4);
    assert.ok(!('prompt' in l) && !('completion' in l), '--log-prompts is off by default');
    assert.match(l.time, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);
  }
  assert.ok(lines.some((l) => l.cache === 'hit'));

  const log2 = path.join(dir, 'req2.log');
  srv = await startServer(['--request-log', log2, '--log-prompts'], { registry });
  let text;
  try {
    const r = await postJSON(`${srv.url}/v1/chat/completions`, { model: 'a', messages: [{ role: 'user', content: 'hello there' }], max_tokens: 5 });
    text = r.json.choices[0].message.content;
    const refused = await postJSON(`${srv.url}/v1/chat/completions`, { model: 'nope', messages: [{ role: 'user', content: 'x' }] });
    assert.equal(refused.status, 404);
  } finally {
    await srv.stop();
  }
  const [line, refusedLine] = fs.readFileSync(log2, 'utf8').trim().split('\n').map((l) => JSON.parse(l));
  assert.deepEqual(line.prompt, [{ role: 'user', content: 'hello there' }]);
  assert.deepEqual(line.completion, [text]);
  assert.equal(line.cache, null, 'no cache: not a hit nor a miss');
  assert.equal(refusedLine.status, 404, 'a refused request has its line too');
  assert.equal(refusedLine.model_requested, 'nope');
  assert.equal(refusedLine.model, null, 'no model served it');
});

test('a corrupt usage.db and a locked one: a clear log line, answers keep coming, nothing recorded is lost', async () => {
  // Corrupt: not a database at all.
  const bad = path.join(dir, 'state-bad');
  fs.mkdirSync(bad);
  fs.writeFileSync(path.join(bad, 'usage.db'), 'this is not a database\n'.repeat(200));
  let srv = await startServer(['--state-dir', bad], { registry });
  try {
    for (let i = 0; i < 3; i++)
      assert.equal((await postJSON(`${srv.url}/v1/completions`, { model: 'a', prompt: 'Once', max_tokens: 3 })).status, 200);
    const r = await getJSON(`${srv.url}/v1/usage`);
    assert.equal(r.status, 503);
    assert.match(r.json.error.message, /usage\.db.*not a database/);
    assert.match(srv.stderr(), /usage: .*usage\.db.*not a database.*keeps serving/);
  } finally {
    await srv.stop();
  }

  // Locked: another process holds the write lock for 3 s (python3's sqlite3).
  const state = path.join(dir, 'state-locked');
  srv = await startServer(['--state-dir', state], { registry });
  let holder;
  try {
    assert.equal((await postJSON(`${srv.url}/v1/completions`, { model: 'a', prompt: 'Once', max_tokens: 3 })).status, 200);
    assert.equal((await getJSON(`${srv.url}/v1/usage`)).json.data[0].requests, 1); // the file exists now
    holder = spawn('python3', ['-c', `
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute('BEGIN EXCLUSIVE')
print('locked', flush=True)
time.sleep(3)
db.execute('COMMIT')
`, path.join(state, 'usage.db')], { stdio: ['ignore', 'pipe', 'inherit'] });
    await new Promise((resolve) => holder.stdout.once('data', resolve));
    const t0 = Date.now();
    for (let i = 0; i < 5; i++) {
      const r = await postJSON(`${srv.url}/v1/completions`, { model: 'a', prompt: 'Once', max_tokens: 3 });
      assert.equal(r.status, 200);
    }
    const elapsed = Date.now() - t0;
    assert.ok(elapsed < 2000, `five answers took ${elapsed} ms while usage.db was locked`);
    await new Promise((resolve) => holder.on('exit', resolve));
    // The writer retries: once the lock is gone, all six are there.
    let rows;
    for (let k = 0; k < 50; k++) {
      rows = (await getJSON(`${srv.url}/v1/usage`)).json.data;
      if (rows?.[0]?.requests === 6) break;
      await sleep(100);
    }
    assert.equal(rows[0].requests, 6, JSON.stringify(rows));
    assert.match(srv.stderr(), /usage: .*usage\.db.*locked.*retried; the server keeps serving/);
  } finally {
    holder?.kill();
    await srv.stop();
  }
});
