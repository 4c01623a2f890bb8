// What a shared server owes every client (issue 14): an x-request-id on
// every response (the client's own kept when it is a sane token, else one
// made here), CORS for browser clients with --cors (preflight OPTIONS
// answered like llama-server and Ollama do, and the headers a page may
// read exposed), and a second server on a port already in use refusing
// to start with a clear message instead of sharing the port.
import test, { after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { BIN, MODEL, startServer, rawExchange } from './lib/harness.mjs';
import { complete } from './lib/gateway.mjs';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sb-gwadmit-hygiene-'));
after(() => fs.rmSync(dir, { recursive: true, force: true }));

test('x-request-id on every response: kept when sane, made otherwise', async () => {
  const srv = await startServer(['--state-dir', path.join(dir, 'ids')]);
  try {
    const mine = await complete(srv.url, null, {}, { 'x-request-id': 'client-id_1.2:3' });
    assert.equal(mine.status, 200);
    assert.equal(mine.headers.get('x-request-id'), 'client-id_1.2:3');
    const made = new Set();
    for (const bad of [null, 'has space', 'x'.repeat(100), 'semi;colon']) {
      const r = await complete(srv.url, null, {}, bad ? { 'x-request-id': bad } : {});
      const id = r.headers.get('x-request-id');
      assert.match(id, /^req_[0-9a-f]{16}$/);
      made.add(id);
    }
    assert.equal(made.size, 4);
    // Errors, /health, /metrics, unknown routes and the HTTP layer's own answers through us too.
    for (const p of ['/health', '/metrics', '/v1/models', '/nope'])
      assert.match((await fetch(`${srv.url}${p}`)).headers.get('x-request-id'), /^req_/);
    const bad = await complete(srv.url, null, { max_tokens: 'x' });
    assert.equal(bad.status, 400);
    assert.match(bad.headers.get('x-request-id'), /^req_/);
    const { got } = await rawExchange(srv.port, 'GET /health HTTP/1.1\r\nHost: x\r\nx-request-id: raw-1\r\nConnection: close\r\n\r\n');
    assert.match(got, /\r\nx-request-id: raw-1\r\n/i);
  } finally {
    await srv.stop();
  }
});

test('CORS: preflight answered, allowed origins get the headers, others do not', async () => {
  const srv = await startServer(['--state-dir', path.join(dir, 'cors'), '--cors', 'http://app.example,http://other.example']);
  try {
    const pre = await fetch(`${srv.url}/v1/chat/completions`, {
      method: 'OPTIONS',
      headers: { origin: 'http://app.example', 'access-control-request-method': 'POST', 'access-control-request-headers': 'authorization, content-type' },
    });
    assert.equal(pre.status, 204);
    assert.equal(pre.headers.get('access-control-allow-origin'), 'http://app.example');
    assert.match(pre.headers.get('access-control-allow-methods'), /POST/);
    assert.equal(pre.headers.get('access-control-allow-headers'), 'authorization, content-type');
    assert.ok(Number(pre.headers.get('access-control-max-age')) > 0);
    assert.equal(pre.headers.get('vary'), 'Origin');
    const r = await complete(srv.url, null, {}, { origin: 'http://other.example' });
    assert.equal(r.status, 200);
    assert.equal(r.headers.get('access-control-allow-origin'), 'http://other.example');
    assert.match(r.headers.get('access-control-expose-headers'), /x-request-id/);
    assert.match(r.headers.get('access-control-expose-headers'), /x-ratelimit-remaining-requests/);
    const stranger = await complete(srv.url, null, {}, { origin: 'http://evil.example' });
    assert.equal(stranger.headers.get('access-control-allow-origin'), null);
    const strangerPre = await fetch(`${srv.url}/v1/models`, { method: 'OPTIONS', headers: { origin: 'http://evil.example' } });
    assert.equal(strangerPre.headers.get('access-control-allow-origin'), null);
  } finally {
    await srv.stop();
  }
  const any = await startServer(['--state-dir', path.join(dir, 'cors'), '--cors', '*']);
  try {
    const r = await fetch(`${any.url}/v1/models`, { headers: { origin: 'http://anywhere.example' } });
    assert.equal(r.headers.get('access-control-allow-origin'), '*');
    const pre = await fetch(`${any.url}/v1/models`, { method: 'OPTIONS', headers: { origin: 'http://x' } });
    assert.equal(pre.status, 204);
    assert.equal(pre.headers.get('access-control-allow-methods'), 'GET');
  } finally {
    await any.stop();
  }
  // Without --cors: no CORS headers, and OPTIONS is not a method of the routes.
  const none = await startServer(['--state-dir', path.join(dir, 'cors')]);
  try {
    const r = await fetch(`${none.url}/v1/models`, { headers: { origin: 'http://app.example' } });
    assert.equal(r.headers.get('access-control-allow-origin'), null);
    assert.equal((await fetch(`${none.url}/v1/models`, { method: 'OPTIONS' })).status, 405);
  } finally {
    await none.stop();
  }
});

test('a second server on a port in use refuses to start, naming the port', async () => {
  const srv = await startServer(['--state-dir', path.join(dir, 'port')]);
  try {
    const second = spawnSync(BIN, ['serve', '-m', MODEL, '--port', String(srv.port), '--state-dir', path.join(dir, 'port')], {
      encoding: 'utf8',
      timeout: 20000,
    });
    assert.equal(second.status, 1, second.stderr);
    assert.match(second.stderr, new RegExp(`cannot listen on 127\\.0\\.0\\.1:${srv.port}: Address already in use`));
    // The first one still has every request.
    for (let i = 0; i < 10; i++) assert.equal((await fetch(`${srv.url}/health`)).status, 200);
  } finally {
    await srv.stop();
  }
});
