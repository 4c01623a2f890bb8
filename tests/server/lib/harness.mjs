// Shared by the tests/server/*.mjs tests: starts `switchboard serve` on a
// free port (--port 0; the server prints the port it got), waits until
// /health says ok, and stops it at the end, failing if it did not exit
// cleanly (under ASan a leak or error makes the exit status non-zero).
import { spawn, spawnSync } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import net from 'node:net';

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, '../../..');
export const BIN = process.env.SB_BIN || path.join(root, 'build/switchboard');
export const SHARED = process.env.SB_SHARED_DIR || path.resolve(root, '../shared');
export const MODEL = path.join(SHARED, 'models/stories260K.gguf');
export const MODEL_ID = 'stories260K';

// `registry`: serve that models.json or directory (--models) instead of one model.
export async function startServer(args = [], { model = MODEL, registry = null, timeoutMs = 60000 } = {}) {
  const source = registry ? ['--models', registry] : ['-m', model];
  const proc = spawn(BIN, ['serve', ...source, '--port', '0', '--quiet', ...args], {
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  let stderr = '';
  const port = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`server did not start in ${timeoutMs} ms:\n${stderr}`)), timeoutMs);
    proc.stderr.on('data', (d) => {
      stderr += d;
      const m = /listening on http:\/\/[^:\s]+:(\d+)/.exec(stderr);
      if (m) {
        clearTimeout(timer);
        resolve(Number(m[1]));
      }
    });
    proc.on('exit', (code, sig) => {
      clearTimeout(timer);
      reject(new Error(`server exited (${code ?? sig}) before listening:\n${stderr}`));
    });
  });
  const url = `http://127.0.0.1:${port}`;
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    try {
      const r = await fetch(`${url}/health`);
      if (r.status === 200) break;
    } catch {}
    if (Date.now() > deadline) throw new Error(`server never became healthy:\n${stderr}`);
    await sleep(20);
  }
  const exited = new Promise((resolve) => proc.on('exit', (code, sig) => resolve({ code, sig })));
  return {
    url,
    port,
    proc,
    stderr: () => stderr,
    // SIGTERM, then the exit status must be 0 within the time limit.
    async stop(limitMs = 30000) {
      proc.kill('SIGTERM');
      const t = setTimeout(() => proc.kill('SIGKILL'), limitMs);
      const { code, sig } = await exited;
      clearTimeout(t);
      if (code !== 0) throw new Error(`server exited with ${code ?? sig}:\n${stderr.slice(-6000)}`);
    },
  };
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Writes a generated model (switchboard gen-model; small by default) to `out`.
export function genModel(out, { seed = 1, dim = 64, hidden = 128, layers = 2, heads = 4, kvHeads = heads, vocab = 512, ctx = 256, type = 'q8_0' } = {}) {
  const r = spawnSync(BIN, ['gen-model', '--out', out, '--type', type, '--dim', String(dim), '--hidden', String(hidden),
    '--layers', String(layers), '--heads', String(heads), '--kv-heads', String(kvHeads), '--vocab', String(vocab), '--ctx', String(ctx), '--seed', String(seed)],
  { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`gen-model failed: ${r.stderr}`);
  return out;
}

export async function postJSON(url, body, init = {}) {
  const r = await fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: typeof body === 'string' ? body : JSON.stringify(body),
    ...init,
  });
  const text = await r.text();
  let json = null;
  try {
    json = JSON.parse(text);
  } catch {}
  return { status: r.status, headers: r.headers, text, json };
}

// Reads a streaming response's SSE events: the parsed chunks and whether [DONE] came.
export async function readSSE(response) {
  const chunks = [];
  let done = false;
  let buf = '';
  const decoder = new TextDecoder();
  for await (const part of response.body) {
    buf += decoder.decode(part, { stream: true });
    let i;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const event = buf.slice(0, i);
      buf = buf.slice(i + 2);
      if (!event.startsWith('data: ')) throw new Error(`not an SSE data line: ${event}`);
      const data = event.slice(6);
      if (data === '[DONE]') done = true;
      else chunks.push(JSON.parse(data));
    }
  }
  if (buf.length) throw new Error(`stream ended mid-event: ${buf}`);
  return { chunks, done };
}

// Prometheus text -> { 'name{labels}': value }. Series labelled with the
// serving model also count, summed over models, under their name without
// that label ('x{model="a",le="1"}' adds to 'x{le="1"}', 'x{model="a"}' to 'x').
export async function metrics(url) {
  const text = await (await fetch(`${url}/metrics`)).text();
  const out = {};
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const sp = line.lastIndexOf(' ');
    const key = line.slice(0, sp), v = Number(line.slice(sp + 1));
    out[key] = v;
    const m = /^([^{]+)\{model="(?:[^"\\]|\\.)*",?(.*)\}$/.exec(key);
    if (m) {
      const total = m[2] ? `${m[1]}{${m[2]}}` : m[1];
      out[total] = (out[total] ?? 0) + v;
    }
  }
  return out;
}

// A raw TCP connection for requests no HTTP client would send.
export function rawSocket(port) {
  return new Promise((resolve, reject) => {
    const s = net.connect(port, '127.0.0.1', () => resolve(s));
    s.on('error', reject);
  });
}

// Sends raw bytes and collects everything until the server closes (or the limit).
export async function rawExchange(port, data, limitMs = 10000) {
  const s = await rawSocket(port);
  return new Promise((resolve) => {
    let got = '';
    const t = setTimeout(() => {
      s.destroy();
      resolve({ got, closed: false });
    }, limitMs);
    s.on('data', (d) => (got += d));
    s.on('error', () => {});
    s.on('close', () => {
      clearTimeout(t);
      resolve({ got, closed: true });
    });
    s.write(data);
  });
}
