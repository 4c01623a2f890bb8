// API keys (issue 14, admission): `switchboard keys` on a state directory
// and a running `switchboard serve --state-dir` that checks them: a key
// works with the official client, a disable takes effect on the running
// server within a second, an expired key stops working, missing, wrong,
// disabled and expired keys all get the same 401 body, a key on a model it
// may not use gets 403, /admin/... needs an admin key, /health stays open,
// /metrics is private with --metrics-auth, malformed credentials are clear
// errors, the state directory never holds a raw key, and a corrupt or
// locked keys.db gives a clear message.
import test, { after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';
import { BIN, MODEL_ID, startServer, rawExchange, sleep } from './lib/harness.mjs';
import { complete, createKey, get, keysCli } from './lib/gateway.mjs';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sb-gwadmit-keys-'));
after(() => fs.rmSync(dir, { recursive: true, force: true }));

test('keys: create, use, disable live, expire, 401 bodies alike, 403 model, admin routes, /health open', async () => {
  const state = path.join(dir, 'state');
  const alice = createKey(state, 'alice');
  const admin = createKey(state, 'root', ['--admin', '--tier', 'paid']);
  const narrow = createKey(state, 'narrow', ['--models', 'some-other-model']);
  const disabled = createKey(state, 'off');
  assert.equal(keysCli(state, ['disable', 'off']).status, 0);

  const list = keysCli(state, ['list']);
  assert.equal(list.status, 0, list.stderr);
  for (const n of ['alice', 'root', 'narrow', 'off']) assert.match(list.stdout, new RegExp(`^${n} `, 'm'));
  assert.match(list.stdout, /^off\s+free\s.*disabled/m);

  const srv = await startServer(['--state-dir', state]);
  try {
    // The official client with its apiKey.
    const client = new OpenAI({ baseURL: `${srv.url}/v1`, apiKey: alice, maxRetries: 0 });
    const c = await client.completions.create({ model: MODEL_ID, prompt: 'Once upon a time', max_tokens: 4, temperature: 0 });
    assert.equal(c.choices.length, 1);
    assert.equal(c.usage.completion_tokens, 4);
    // x-api-key works too.
    assert.equal((await complete(srv.url, null, {}, { 'x-api-key': alice })).status, 200);

    // Missing, wrong, disabled: one 401 body, which says nothing about the key.
    const missing = await complete(srv.url, null);
    const wrong = await complete(srv.url, alice.slice(0, -1) + (alice.endsWith('0') ? '1' : '0'));
    const off = await complete(srv.url, disabled);
    const unknown = await complete(srv.url, 'sk-sb-' + '0'.repeat(48));
    for (const r of [missing, wrong, off, unknown]) {
      assert.equal(r.status, 401, r.text);
      assert.equal(r.json.error.code, 'invalid_api_key');
      assert.equal(r.json.error.type, 'invalid_request_error');
    }
    assert.equal(off.text, unknown.text);
    assert.equal(wrong.text, unknown.text);
    assert.equal(missing.text, unknown.text);
    await assert.rejects(
      new OpenAI({ baseURL: `${srv.url}/v1`, apiKey: disabled, maxRetries: 0 }).completions.create({ model: MODEL_ID, prompt: 'x', max_tokens: 1 }),
      (e) => e.status === 401,
    );

    // A model the key may not use.
    const denied = await complete(srv.url, narrow);
    assert.equal(denied.status, 403, denied.text);
    assert.equal(denied.json.error.code, 'model_not_allowed');
    assert.match(denied.json.error.message, /some-other-model/);

    // Admin routes: the admin key only.
    assert.equal((await get(srv.url, '/admin/models')).status, 401);
    const notAdmin = await get(srv.url, '/admin/models', alice);
    assert.equal(notAdmin.status, 403);
    assert.equal((await notAdmin.json()).error.code, 'permission_denied');
    assert.equal((await get(srv.url, '/admin/models', admin)).status, 200);
    // /health is open; /v1/models needs a key; /metrics is open without --metrics-auth.
    assert.equal((await get(srv.url, '/health')).status, 200);
    assert.equal((await get(srv.url, '/v1/models')).status, 401);
    assert.equal((await get(srv.url, '/v1/models', alice)).status, 200);
    assert.equal((await get(srv.url, '/metrics')).status, 200);

    // Expiry: works until its time, then 401 with the same body (made
    // now, so that a slow start cannot use up its life).
    const soon = new Date(Date.now() + 3000).toISOString().replace(/\.\d+Z$/, 'Z');
    const expiring = createKey(state, 'brief', ['--expires', soon]);
    for (let i = 0; i < 50 && (await complete(srv.url, expiring, { max_tokens: 1 })).status !== 200; i++) await sleep(50);
    assert.equal((await complete(srv.url, expiring)).status, 200);
    while (Date.now() < Date.parse(soon) + 100) await sleep(100);
    const expired = await complete(srv.url, expiring);
    assert.equal(expired.status, 401);
    assert.equal(expired.text, unknown.text);

    // Disable on the running server: refused within a second.
    assert.equal((await complete(srv.url, alice)).status, 200);
    assert.equal(keysCli(state, ['disable', 'alice']).status, 0);
    const t0 = Date.now();
    let status = 200;
    while (status === 200 && Date.now() - t0 < 3000) {
      status = (await complete(srv.url, alice, { max_tokens: 1 })).status;
      if (status === 200) await sleep(20);
    }
    const took = Date.now() - t0;
    assert.equal(status, 401);
    assert.ok(took < 1000, `the disable took ${took} ms to take effect`);
    assert.equal(keysCli(state, ['enable', 'alice']).status, 0);
    for (let i = 0; i < 50 && (await complete(srv.url, alice, { max_tokens: 1 })).status !== 200; i++) await sleep(50);
    assert.equal((await complete(srv.url, alice, { max_tokens: 1 })).status, 200);
    // Deleted: 401.
    assert.equal(keysCli(state, ['delete', 'alice']).status, 0);
    for (let i = 0; i < 50 && (await complete(srv.url, alice, { max_tokens: 1 })).status !== 401; i++) await sleep(50);
    assert.equal((await complete(srv.url, alice, { max_tokens: 1 })).status, 401);

    // Nothing in the state directory holds a raw key (nor its random part).
    assert.ok(fs.readdirSync(state).includes('keys.db'));
    for (const f of fs.readdirSync(state)) {
      const bytes = fs.readFileSync(path.join(state, f));
      for (const k of [alice, admin, narrow, expiring, disabled]) {
        assert.equal(bytes.indexOf(k), -1, `${f} contains a raw key`);
        assert.equal(bytes.indexOf(k.slice(6)), -1, `${f} contains a key's random part`);
      }
    }
  } finally {
    await srv.stop();
  }
});

test('keys: malformed credentials are clear errors and never crash the server', async () => {
  const state = path.join(dir, 'malformed');
  const key = createKey(state, 'k');
  const srv = await startServer(['--state-dir', state]);
  try {
    const basic = await complete(srv.url, null, {}, { authorization: `Basic ${Buffer.from('a:b').toString('base64')}` });
    assert.equal(basic.status, 401);
    assert.match(basic.json.error.message, /Bearer/);
    const empty = await complete(srv.url, null, {}, { authorization: 'Bearer ' });
    assert.equal(empty.status, 401);
    const long = await complete(srv.url, 'sk-sb-' + 'a'.repeat(400));
    assert.equal(long.status, 401);
    assert.match(long.json.error.message, /at most 256/);
    // Bytes no client library would send: a control character, a high byte.
    for (const bad of ['sk-sb-\x01abc', 'sk-sb-\xffabc']) {
      const req = `POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${bad}\r\nContent-Type: application/json\r\n` +
        `Content-Length: 2\r\nConnection: close\r\n\r\n{}`;
      const { got } = await rawExchange(srv.port, Buffer.from(req, 'latin1'));
      assert.match(got, /^HTTP\/1\.1 (400|401) /, got.slice(0, 200));
    }
    // A huge header: refused by the HTTP layer (431) or the gateway, never a crash.
    const huge = `POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${'a'.repeat(200000)}\r\n` +
      `Content-Length: 2\r\nConnection: close\r\n\r\n{}`;
    const { got } = await rawExchange(srv.port, huge);
    assert.ok(got === '' || /^HTTP\/1\.1 (400|401|413|431) /.test(got), got.slice(0, 200));
    // Still serving.
    assert.equal((await complete(srv.url, key)).status, 200);
    assert.equal((await fetch(`${srv.url}/health`)).status, 200);
  } finally {
    await srv.stop();
  }
});

test('keys: --metrics-auth makes /metrics private; --auth optional lets anonymous calls through', async () => {
  const state = path.join(dir, 'modes');
  const key = createKey(state, 'k');
  const admin = createKey(state, 'a', ['--admin']);
  let srv = await startServer(['--state-dir', state, '--metrics-auth']);
  try {
    assert.equal((await get(srv.url, '/metrics')).status, 401);
    assert.equal((await get(srv.url, '/metrics', key)).status, 403);
    assert.equal((await get(srv.url, '/metrics', admin)).status, 200);
    assert.equal((await get(srv.url, '/health')).status, 200);
  } finally {
    await srv.stop();
  }
  srv = await startServer(['--state-dir', state, '--auth', 'optional']);
  try {
    assert.equal((await complete(srv.url, null)).status, 200);
    assert.equal((await complete(srv.url, key)).status, 200);
    assert.equal((await complete(srv.url, 'sk-sb-wrong')).status, 401, 'a key that is sent must be right');
    assert.equal((await get(srv.url, '/admin/models')).status, 401);
  } finally {
    await srv.stop();
  }
  srv = await startServer(['--state-dir', state, '--auth', 'off']);
  try {
    assert.equal((await complete(srv.url, null)).status, 200);
    assert.equal((await complete(srv.url, 'anything')).status, 200);
  } finally {
    await srv.stop();
  }
  // No keys at all: auth is off by default, until the first key exists.
  const empty = path.join(dir, 'empty');
  srv = await startServer(['--state-dir', empty]);
  try {
    assert.equal((await complete(srv.url, null)).status, 200);
    assert.equal((await get(srv.url, '/admin/models')).status, 200);
    const first = createKey(empty, 'first');
    let status = 200;
    for (let i = 0; i < 50 && status === 200; i++) {
      status = (await complete(srv.url, null)).status;
      if (status === 200) await sleep(50);
    }
    assert.equal(status, 401);
    assert.equal((await complete(srv.url, first)).status, 200);
  } finally {
    await srv.stop();
  }
});

test('keys: unknown tier, bad options, corrupt and locked keys.db', async () => {
  const state = path.join(dir, 'bad');
  let r = keysCli(state, ['create', '--name', 'x', '--tier', 'gold']);
  assert.equal(r.status, 1);
  assert.match(r.stderr, /unknown tier 'gold' \(tiers: paid, free, batch/);
  r = keysCli(state, ['create', '--name', 'x', '--tier', 'gold', '--tiers', 'gold:5,free:0']);
  assert.equal(r.status, 0, r.stderr);
  r = keysCli(state, ['create', '--name', 'x']);
  assert.equal(r.status, 1);
  assert.match(r.stderr, /exists already/);
  r = keysCli(state, ['create', '--name', 'y', '--expires', 'tomorrow']);
  assert.equal(r.status, 1);
  assert.match(r.stderr, /--expires 'tomorrow'/);
  r = keysCli(state, ['create', '--name', 'y', '--rps', '-1']);
  assert.equal(r.status, 2);
  r = keysCli(state, ['disable', 'nobody']);
  assert.equal(r.status, 1);
  assert.match(r.stderr, /no key is called 'nobody'/);
  r = keysCli(state, ['frobnicate']);
  assert.equal(r.status, 2);
  const tiers = spawnSync(BIN, ['serve', '-m', 'x.gguf', '--tiers', 'paid:high'], { encoding: 'utf8' });
  assert.notEqual(tiers.status, 0);
  assert.match(tiers.stderr, /--tiers: 'paid:high'/);

  // A lock held by another process: create waits the busy timeout, then says so.
  const locked = path.join(dir, 'locked');
  const k = createKey(locked, 'k');
  const holder = spawn('python3', ['-c', `
import sqlite3, sys, time
c = sqlite3.connect(sys.argv[1], isolation_level=None)
c.execute('BEGIN EXCLUSIVE')
c.execute("UPDATE keys SET rps = rps WHERE name = 'k'")
print('locked', flush=True)
time.sleep(30)
`, path.join(locked, 'keys.db')], { stdio: ['ignore', 'pipe', 'inherit'] });
  try {
    await new Promise((resolve) => holder.stdout.once('data', resolve));
    const t0 = Date.now();
    r = keysCli(locked, ['create', '--name', 'k2']);
    assert.equal(r.status, 1);
    assert.match(r.stderr, /keys\.db.*another process holds the database locked/);
    assert.ok(Date.now() - t0 >= 1500, 'it waited the busy timeout first');
    // The server still starts on it (reads are not blocked in WAL mode) and serves the key.
    const srv = await startServer(['--state-dir', locked]);
    try {
      assert.equal((await complete(srv.url, k)).status, 200);
    } finally {
      await srv.stop();
    }
  } finally {
    holder.kill('SIGKILL');
  }

  // A corrupt keys.db: the server refuses to start, naming the file.
  const corrupt = path.join(dir, 'corrupt');
  fs.mkdirSync(corrupt);
  fs.writeFileSync(path.join(corrupt, 'keys.db'), 'not a database '.repeat(300));
  const s = spawnSync(BIN, ['serve', '-m', 'unused.gguf', '--port', '0', '--state-dir', corrupt], { encoding: 'utf8', timeout: 20000 });
  assert.equal(s.status, 1);
  assert.match(s.stderr, new RegExp(`${path.join(corrupt, 'keys.db').replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}.*not a database`));
  r = keysCli(corrupt, ['list']);
  assert.equal(r.status, 1);
  assert.match(r.stderr, /keys\.db/);
});
