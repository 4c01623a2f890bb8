// Abuse while well-behaved clients keep working: clients that vanish
// mid-stream (their generations must be cancelled), malformed JSON, a 10 MB
// body, and slow partial requests that must be timed out. Every good answer
// must stay correct, no bad request may get a 5xx, and the server must end
// cleanly (under ASan: without leaks).
import { test, after, before } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, postJSON, readSSE, metrics, rawSocket, rawExchange, sleep, MODEL_ID } from './lib/harness.mjs';

const TIMEOUT_S = 3;
let srv;
before(async () => {
  srv = await startServer(['--threads', '2', '--parallel', '8', '--timeout', String(TIMEOUT_S)]);
});
after(async () => srv && (await srv.stop()));

const good = { model: MODEL_ID, prompt: 'One day a little bird', max_tokens: 24, temperature: 0 };

async function idle(limitMs) {
  const deadline = Date.now() + limitMs;
  for (;;) {
    const m = await metrics(srv.url);
    if ((m.switchboard_running_sequences ?? 0) === 0 && (m.switchboard_queue_length ?? 0) === 0) return true; // no series: no model loaded
    if (Date.now() > deadline) return false;
    await sleep(25);
  }
}

// Engine-side tokens generated since `since` (a metrics snapshot).
const generatedSince = async (since) =>
  (await metrics(srv.url)).switchboard_engine_generated_tokens_total - (since.switchboard_engine_generated_tokens_total ?? 0);

test('clients that go away get their generations cancelled', async () => {
  const long = { model: MODEL_ID, prompt: 'Once upon a time', max_tokens: 3000, temperature: 0.8, stream: true };
  const m0 = await metrics(srv.url);
  // Streaming clients that abort after a couple of chunks.
  await Promise.all(
    Array.from({ length: 8 }, async () => {
      const ac = new AbortController();
      const r = await fetch(`${srv.url}/v1/completions`, { method: 'POST', body: JSON.stringify(long), signal: ac.signal });
      let n = 0;
      try {
        for await (const part of r.body) if (++n === 2) ac.abort();
      } catch (e) {
        assert.equal(e.name, 'AbortError');
      }
    }),
  );
  assert.ok(await idle(10000), 'aborted streams still generating');
  // Had they run on, 8 x 3000 tokens; cancelled, a small part of that.
  const streamed = await generatedSince(m0);
  assert.ok(streamed < 8 * 3000 / 4, `${streamed} tokens generated for 8 aborted streams`);
  const m1 = await metrics(srv.url);
  // Non-streaming clients that close the socket while waiting.
  const body = JSON.stringify({ ...long, stream: false });
  const socks = await Promise.all(Array.from({ length: 4 }, () => rawSocket(srv.port)));
  for (const s of socks) s.write(`POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body}`);
  await sleep(100);
  for (const s of socks) s.destroy();
  assert.ok(await idle(10000), 'abandoned requests still generating');
  const waited = await generatedSince(m1);
  assert.ok(waited < 4 * 3000 / 4, `${waited} tokens generated for 4 abandoned requests`);
});

test('abuse does not disturb good clients', async () => {
  const reference = (await postJSON(`${srv.url}/v1/completions`, good)).json.choices[0].text;
  const streamRef = async () => {
    const r = await fetch(`${srv.url}/v1/completions`, { method: 'POST', body: JSON.stringify({ ...good, stream: true }) });
    const { chunks, done } = await readSSE(r);
    assert.ok(done);
    return chunks.map((c) => c.choices[0]?.text ?? '').join('');
  };
  let stop = false;
  let goodCount = 0;
  const workers = Array.from({ length: 4 }, async (_, w) => {
    while (!stop) {
      const text = w % 2 ? await streamRef() : (await postJSON(`${srv.url}/v1/completions`, good)).json.choices[0].text;
      assert.equal(text, reference);
      goodCount++;
    }
  });

  const abuse = (async () => {
    // Slow partial requests: half the headers, or all headers and half the body.
    const slow = await Promise.all(Array.from({ length: 24 }, () => rawSocket(srv.port)));
    const closed = slow.map((s) => new Promise((resolve) => s.on('close', resolve)));
    slow.forEach((s, i) => {
      s.on('error', () => {});
      s.resume(); // read the 408 the server sends before it closes
      s.write(i % 2 ? 'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le' : 'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"model":');
    });

    // Malformed bodies: all 400, never 5xx.
    const malformed = [
      '', '{', '[]', 'null', '"str"', '{"model": "stories260K", "prompt": "x",}', '\u0000\u0001\u0002',
      Buffer.from([0xff, 0xfe, 0x7b, 0x22]).toString('latin1'), '['.repeat(100000), '{"a":'.repeat(50000),
      '{"model": "stories260K", "prompt": "x", "max_tokens": 1e400}', '{"model": "stories260K", "prompt": {"x": 1}}',
      '{"model": "stories260K", "prompt": [[1, "a"]]}', '{"model": "stories260K", "prompt": "x", "n": 100000}',
      '{"model": "stories260K", "messages": [{"role": "user"}]}', '{"model": "stories260K", "messages": [{"role": "robot", "content": "x"}]}',
      '{"model": "stories260K", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}',
      '{"model": 5, "prompt": "x"}', '{"model": "stories260K", "prompt": "x", "stream": "yes"}',
      '{"model": "stories260K", "prompt": "x", "stream": true, "stream_options": 3}',
    ];
    for (const path of ['completions', 'chat/completions', 'embeddings'])
      for (const body of malformed) {
        const r = await postJSON(`${srv.url}/v1/${path}`, body);
        assert.equal(r.status, 400, `${path} ${JSON.stringify(body.slice(0, 60))}: ${r.status} ${r.text.slice(0, 200)}`);
        assert.ok(r.json?.error?.message, r.text.slice(0, 200));
      }

    // A 10 MB body, declared (Content-Length) and chunked.
    const tenMB = JSON.stringify({ model: MODEL_ID, prompt: 'y'.repeat(10 << 20) });
    const big = await postJSON(`${srv.url}/v1/chat/completions`, tenMB);
    assert.equal(big.status, 413);
    const chunked = await fetch(`${srv.url}/v1/completions`, {
      method: 'POST',
      body: new Blob([tenMB]).stream(),
      duplex: 'half',
    });
    assert.equal(chunked.status, 413);
    await chunked.text();

    // Requests cut off at random points (headers or body) and closed.
    const full = `POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: ${JSON.stringify(good).length}\r\n\r\n${JSON.stringify(good)}`;
    for (let cut = 5; cut < full.length; cut += 17) {
      const s = await rawSocket(srv.port);
      s.on('error', () => {});
      s.end(full.slice(0, cut));
      s.destroy();
    }
    // Garbage that is not HTTP.
    const junk = await rawExchange(srv.port, 'HELLO\r\n\r\n\u0000\u0000GET\r\n\r\n', 5000);
    assert.ok(junk.closed);

    // The slow ones are dropped after the connection timeout.
    const t0 = Date.now();
    await Promise.all(closed);
    assert.ok(Date.now() - t0 < (TIMEOUT_S + 4) * 1000, 'slow connections were not timed out');
  })();

  try {
    await abuse;
  } finally {
    stop = true;
    await Promise.all(workers);
  }
  assert.ok(goodCount >= 8, `only ${goodCount} good requests completed during the abuse`);
  assert.ok(await idle(10000), 'requests still running after the abuse');
  const m = await metrics(srv.url);
  const fivexx = Object.entries(m).filter(([k, v]) => /status="5/.test(k) && v > 0);
  assert.deepEqual(fivexx, []);
  assert.equal((await fetch(`${srv.url}/health`)).status, 200);
});
