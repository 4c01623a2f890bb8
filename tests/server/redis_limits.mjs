// Rate limits shared through Redis (issue 14, admission): two
// `switchboard serve --redis` replicas on one state directory share one
// key's bucket (the admissions of both together stay within capacity +
// rate * window in every window), and killing Redis mid-test fails no
// request: each replica falls back to its own buckets within the client's
// bounded timeout. Skipped when /usr/bin/redis-server is absent.
import test, { after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startServer, sleep } from './lib/harness.mjs';
import { checkWindows, complete, createKey, hammer, haveRedis, startRedis } from './lib/gateway.mjs';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sb-gwadmit-redis-'));
after(() => fs.rmSync(dir, { recursive: true, force: true }));

test('two replicas share a key through Redis; Redis dying fails no request', { skip: !haveRedis() && 'no /usr/bin/redis-server' }, async () => {
  const redis = await startRedis();
  const state = path.join(dir, 'state');
  const key = createKey(state, 'shared', ['--rps', '5']);
  const wide = createKey(state, 'wide', ['--rps', '1000']);
  const args = ['--state-dir', state, '--redis', redis.url];
  // Inside the try: a replica that fails to start must not leave Redis
  // running, which would keep this process (and the suite) alive forever.
  let a, b;
  try {
    a = await startServer(args);
    b = await startServer(args);
    // One bucket for both: 100 requests alternating between the replicas.
    const t0 = Date.now();
    const { admitted, refused } = await hammer({
      total: 100,
      workers: 20,
      send: (i) => complete(i % 2 ? a.url : b.url, key, { max_tokens: 1 }),
    });
    const seconds = (Date.now() - t0) / 1000;
    for (const x of admitted) x.cost = 1;
    const worst = checkWindows(admitted, 5, 5);
    assert.ok(refused.length > 0);
    // Apart, each replica would admit 5 per second: 100 would take ~9.5 s; together ~19 s.
    assert.ok(seconds >= 18, `100 admissions through one shared bucket took only ${seconds} s`);
    const byServer = [0, 0];
    for (const x of admitted) byServer[x.i % 2]++;
    assert.deepEqual(byServer, [50, 50]);
    console.log(`# 100 admitted by two replicas in ${seconds.toFixed(1)} s (one bucket: >= 19 s), ${refused.length} refusals, tightest window ${(worst * 100).toFixed(0)}%`);

    // Redis dies while both replicas are busy: every request still succeeds.
    let stop = false;
    const statuses = [];
    const latencies = [];
    const load = Promise.all(Array.from({ length: 8 }, async (_, w) => {
      while (!stop) {
        const t = performance.now();
        const r = await complete(w % 2 ? a.url : b.url, wide, { max_tokens: 1 });
        latencies.push(performance.now() - t);
        statuses.push(r.status);
      }
    }));
    await sleep(700);
    await redis.stop();
    const killedAt = statuses.length;
    await sleep(1500);
    stop = true;
    await load;
    assert.ok(statuses.length > killedAt + 10, 'requests went on after Redis died');
    assert.deepEqual([...new Set(statuses)], [200], `statuses ${JSON.stringify(statuses.filter((s) => s !== 200).slice(0, 5))}`);
    latencies.sort((x, y) => x - y);
    console.log(`# ${statuses.length} requests across the Redis kill, all 200; latency p50 ${latencies[latencies.length >> 1].toFixed(1)} ms, max ${latencies[latencies.length - 1].toFixed(1)} ms`);

    // Without Redis each replica limits on its own: 5 of a burst of 12 at one.
    const burst = await Promise.all(Array.from({ length: 12 }, () => complete(a.url, key, { max_tokens: 1 })));
    const ok = burst.filter((r) => r.status === 200).length;
    assert.ok(ok >= 5 && ok <= 6, `${ok} of 12 admitted by the local bucket`);
    for (const r of burst.filter((r) => r.status !== 200)) {
      assert.equal(r.status, 429);
      assert.ok(Number(r.headers.get('retry-after')) >= 1);
    }
  } finally {
    await redis.stop().catch(() => {});
    await a?.stop();
    await b?.stop();
  }
});
