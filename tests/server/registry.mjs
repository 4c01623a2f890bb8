// The registry behind the server (issue 13): several models under a memory
// budget (LRU eviction, pinned models, 507 for one that cannot fit), hot
// swap of a model's file by rename and in place under streaming load, A/B
// routes split by weight and sticky per user, fallback, per-model metrics,
// bad registry files refused while the old registry keeps serving, and the
// context a model was trained for.
import test, { after, before } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startServer, postJSON, metrics, readSSE, sleep, genModel, MODEL } from './lib/harness.mjs';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sb-registry-'));
after(() => fs.rmSync(dir, { recursive: true, force: true }));

// Big enough that their memory dwarfs the process's own (~13 MB each).
const mid = { dim: 384, hidden: 1024, layers: 6, heads: 6, kvHeads: 6, vocab: 2048, ctx: 256 };
const writeRegistry = (name, obj) => {
  const p = path.join(dir, name);
  fs.writeFileSync(p, typeof obj === 'string' ? obj : JSON.stringify(obj, null, 2));
  return p;
};
const complete = (url, model, extra = {}) =>
  postJSON(`${url}/v1/completions`, { model, prompt: 'Once upon a time', max_tokens: 4, temperature: 0, ...extra });
const adminModels = async (url) => (await (await fetch(`${url}/admin/models`)).json());
const state = async (url) => Object.fromEntries((await adminModels(url)).data.map((m) => [m.name, m.state]));
const rss = async (url) => (await metrics(url)).process_resident_memory_bytes;

before(() => {
  for (const n of ['a', 'b', 'c', 'p']) genModel(path.join(dir, `${n}.gguf`), { ...mid, seed: n.charCodeAt(0) });
});

test('three models under a budget that fits two: LRU eviction, pinned stays, 507 for one too big', async (t) => {
  if (process.env.SB_SANITIZE === '1') t.diagnostic('sanitized build: the RSS bound is not checked (ASan quarantines freed memory)');
  const models = ['a', 'b', 'c'].map((n) => ({ name: n, path: `${n}.gguf`, device: 'cpu' }));
  models.push({ name: 'huge', path: 'p.gguf', device: 'cpu', context: 65536 }); // its KV pool alone passes the budget
  const reg = writeRegistry('budget.json', { models });
  // First measure what one model costs, on a server with room for all.
  let srv = await startServer([], { registry: reg });
  let cost;
  try {
    assert.equal((await complete(srv.url, 'a')).status, 200);
    cost = (await adminModels(srv.url)).data.find((m) => m.name === 'a').memory_bytes;
    assert.ok(cost > 10e6, `a costs ${cost} bytes`);
  } finally {
    await srv.stop();
  }
  const budget = Math.floor(cost * 2.5);
  srv = await startServer(['--memory-budget', String(budget)], { registry: reg });
  try {
    const base = await rss(srv.url);
    // Concurrent requests for a model that is not loaded wait for one load.
    const burst = await Promise.all(Array.from({ length: 8 }, () => complete(srv.url, 'c')));
    assert.deepEqual(burst.map((r) => r.status), Array(8).fill(200));
    assert.equal((await metrics(srv.url)).switchboard_model_loads_total, 1, 'one load for eight requests');
    let peak = base;
    const order = ['a', 'b', 'a', 'c', 'b', 'a', 'c', 'c', 'b', 'a', 'b', 'c'];
    const loaded = ['c']; // our own LRU model of what should be loaded, most recent last
    for (const m of order) {
      const r = await complete(srv.url, m);
      assert.equal(r.status, 200, r.text);
      assert.equal(r.json.model, m);
      const i = loaded.indexOf(m);
      if (i >= 0) loaded.splice(i, 1);
      loaded.push(m);
      if (loaded.length > 2) loaded.shift(); // the least recently used goes
      const s = await state(srv.url);
      for (const n of ['a', 'b', 'c'])
        assert.equal(s[n] === 'loaded', loaded.includes(n), `after ${m}: ${n} is ${s[n]}, expected loaded = ${loaded}`);
      peak = Math.max(peak, await rss(srv.url));
    }
    // The budget bounds what models take; the process's own memory (base) and 16 MiB of slack
    // come on top. Under AddressSanitizer freed memory sits in its quarantine: not checked there.
    const margin = 16 << 20;
    if (process.env.SB_SANITIZE !== '1')
      assert.ok(peak <= base + budget + margin, `peak RSS ${peak} > base ${base} + budget ${budget} + ${margin}`);
    const used = (await adminModels(srv.url)).memory;
    assert.ok(used.used_bytes <= used.budget_bytes, JSON.stringify(used));
    const tooBig = await complete(srv.url, 'huge');
    assert.equal(tooBig.status, 507, tooBig.text);
    assert.match(tooBig.json.error.message, /needs about [\d.]+ MiB but the memory budget is [\d.]+ MiB/);
    assert.equal((await state(srv.url)).c, 'loaded', 'refusing it evicted a model for nothing');
    assert.equal((await complete(srv.url, 'a')).status, 200); // and serving goes on
    const m = await metrics(srv.url);
    assert.ok(m.switchboard_model_evictions_total >= 6, `evictions ${m.switchboard_model_evictions_total}`);
  } finally {
    await srv.stop();
  }
  // A pinned model is loaded at start and never evicted.
  const pinned = writeRegistry('pinned.json', { models: [{ name: 'p', path: 'p.gguf', device: 'cpu', pinned: true },
    ...['a', 'b'].map((n) => ({ name: n, path: `${n}.gguf`, device: 'cpu' }))] });
  srv = await startServer(['--memory-budget', String(budget)], { registry: pinned });
  try {
    assert.equal((await state(srv.url)).p, 'loaded');
    for (const m of ['a', 'b', 'a', 'b']) {
      assert.equal((await complete(srv.url, m)).status, 200);
      const s = await state(srv.url);
      assert.equal(s.p, 'loaded', `pinned model evicted after ${m}`);
      assert.equal(s[m], 'loaded');
    }
  } finally {
    await srv.stop();
  }
});

// Streams greedy completions from `clients` loops until stopped; counts failures.
function streamLoad(url, model, clients) {
  let stop = false;
  const stats = { ok: 0, failed: [] };
  const loops = Array.from({ length: clients }, async () => {
    while (!stop) {
      try {
        const r = await fetch(`${url}/v1/completions`, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify({ model, prompt: 'The dog', max_tokens: 24, temperature: 0, stream: true }),
        });
        if (r.status !== 200) throw new Error(`status ${r.status}: ${await r.text()}`);
        const { done, chunks } = await readSSE(r);
        if (!done || chunks.some((c) => c.error)) throw new Error('stream did not finish cleanly');
        stats.ok++;
      } catch (e) {
        stats.failed.push(String(e));
      }
    }
  });
  return { stats, stop: async () => { stop = true; await Promise.all(loops); } };
}

const greedyText = async (url, model) => (await complete(url, model, { max_tokens: 12 })).json.choices[0].text;

async function waitVersion(url, name, version, limitMs = 20000) {
  const deadline = Date.now() + limitMs;
  for (;;) {
    const m = (await adminModels(url)).data.find((x) => x.name === name);
    if (m.version >= version && m.state === 'loaded') return m;
    if (Date.now() > deadline) throw new Error(`${name} never reached version ${version}: ${JSON.stringify(m)}`);
    await sleep(50);
  }
}

test('hot swap by rename and in place under streaming load: no failed request, new weights after', async () => {
  const live = path.join(dir, 'live.gguf');
  fs.copyFileSync(path.join(dir, 'a.gguf'), live);
  // ref-* serve copies of each version, to know what the swapped model must answer.
  const reg = writeRegistry('swap.json', { models: [
    { name: 'live', path: 'live.gguf', device: 'cpu' },
    { name: 'ref-a', path: 'a.gguf', device: 'cpu' },
    { name: 'ref-b', path: 'b.gguf', device: 'cpu' },
  ] });
  const srv = await startServer([], { registry: reg });
  try {
    const textA = await greedyText(srv.url, 'ref-a'), textB = await greedyText(srv.url, 'ref-b');
    assert.notEqual(textA, textB);
    assert.equal(await greedyText(srv.url, 'live'), textA);
    const v1 = (await adminModels(srv.url)).data.find((x) => x.name === 'live').version;
    const load = streamLoad(srv.url, 'live', 4);
    await sleep(300);
    // 1. A new file renamed over the old one (what `cp new tmp && mv tmp live.gguf` does); the watcher sees it.
    fs.copyFileSync(path.join(dir, 'b.gguf'), path.join(dir, 'live.tmp'));
    fs.renameSync(path.join(dir, 'live.tmp'), live);
    await waitVersion(srv.url, 'live', v1 + 1);
    assert.equal(await greedyText(srv.url, 'live'), textB, 'after the rename: not the new weights');
    await sleep(300);
    // 2. The same file rewritten in place (truncated, then written), then an explicit reload.
    fs.writeFileSync(live, fs.readFileSync(path.join(dir, 'a.gguf')));
    const rl = await postJSON(`${srv.url}/admin/reload`, {});
    assert.equal(rl.status, 200, rl.text);
    await waitVersion(srv.url, 'live', v1 + 2);
    assert.equal(await greedyText(srv.url, 'live'), textA, 'after the rewrite: not the new weights');
    await sleep(300);
    await load.stop();
    assert.deepEqual(load.stats.failed, [], `${load.stats.failed.length} failed of ${load.stats.ok + load.stats.failed.length}`);
    assert.ok(load.stats.ok >= 8, `only ${load.stats.ok} streams completed`);
    const m = await metrics(srv.url);
    assert.ok(m.switchboard_model_swaps_total >= 2);
  } finally {
    await srv.stop();
  }
});

test('A/B route: 1,000 requests split 80/20 within tolerance, sticky per user, counted per served model', async () => {
  const reg = writeRegistry('ab.json', {
    models: [{ name: 'arm-a', path: MODEL, device: 'cpu' }, { name: 'arm-b', path: MODEL, device: 'cpu' }],
    routes: [{ name: 'story-ab', split: [{ model: 'arm-a', weight: 80 }, { model: 'arm-b', weight: 20 }] }],
  });
  const srv = await startServer([], { registry: reg });
  try {
    const n = 1000, counts = { 'arm-a': 0, 'arm-b': 0 }, arm = {};
    for (let i = 0; i < n; i += 50)
      await Promise.all(Array.from({ length: 50 }, async (_, k) => {
        const user = `user-${i + k}`;
        const r = await complete(srv.url, 'story-ab', { user, max_tokens: 1 });
        assert.equal(r.status, 200, r.text);
        assert.equal(r.json.metadata.route, 'story-ab');
        assert.equal(r.headers.get('x-switchboard-model'), r.json.model);
        counts[r.json.model]++;
        arm[user] = r.json.model;
      }));
    // Binomial(1000, 0.8): sd 12.6; 4 sd either side fails by chance once in ~15,000 runs.
    assert.ok(Math.abs(counts['arm-a'] - 800) <= 51, JSON.stringify(counts));
    for (let i = 0; i < 100; i++) {
      const user = `user-${i * 7}`;
      const r = await complete(srv.url, 'story-ab', { user, max_tokens: 1 });
      assert.equal(r.json.model, arm[user], `${user} changed arms`);
    }
    const m = await metrics(srv.url);
    const served = (name) => m[`switchboard_generations_total{model="${name}"}`] ?? 0;
    const armA = counts['arm-a'] + Object.entries(arm).filter(([u, a]) => a === 'arm-a' && Number(u.slice(5)) % 7 === 0 && Number(u.slice(5)) < 700).length;
    assert.equal(served('arm-a') + served('arm-b'), n + 100);
    assert.equal(served('arm-a'), armA);
    assert.equal(m['switchboard_generations_total{model="story-ab"}'], undefined, 'metrics name the route, not the model');
    // The exposition passes Prometheus's own linter (tools/install-deps.sh installs it).
    const text = await (await fetch(`${srv.url}/metrics`)).text();
    const lint = spawnSync('promtool', ['check', 'metrics'], { input: text, encoding: 'utf8' });
    assert.equal(lint.error, undefined, `promtool: ${lint.error}`);
    assert.equal(lint.status, 0, `promtool check metrics: ${lint.stdout}${lint.stderr}`);
  } finally {
    await srv.stop();
  }
});

test('fallback for unknown models, 404 listing names without one; bad registry files change nothing', async () => {
  fs.writeFileSync(path.join(dir, 'broken.gguf'), 'GGUF but not really a model file');
  const good = { fallback: 'main', models: [{ name: 'main', path: MODEL, device: 'cpu', aliases: ['m'] },
    { name: 'broken', path: 'broken.gguf', device: 'cpu' }] };
  const reg = writeRegistry('models.json', good);
  const srv = await startServer(['--no-watch'], { registry: reg });
  try {
    const fb = await complete(srv.url, 'no-such-model');
    assert.equal(fb.status, 200);
    assert.equal(fb.json.model, 'main');
    assert.match(fb.json.metadata.fallback, /unknown model 'no-such-model'/);
    assert.match(fb.headers.get('x-switchboard-fallback'), /unknown model/);
    assert.equal((await complete(srv.url, 'm')).json.model, 'main', 'an alias serves its model');
    const names = (await (await fetch(`${srv.url}/v1/models`)).json()).data.map((x) => x.id);
    assert.deepEqual(names.sort(), ['broken', 'm', 'main']);
    // A model that fails to load falls back too, and /admin/models keeps its error.
    const br = await complete(srv.url, 'broken');
    assert.equal(br.status, 200, br.text);
    assert.equal(br.json.model, 'main');
    assert.match(br.json.metadata.fallback, /model 'broken' failed to load: .*broken\.gguf/);
    const info = (await adminModels(srv.url)).data.find((x) => x.name === 'broken');
    assert.equal(info.state, 'failed');
    assert.match(info.error, /broken\.gguf/);

    const bad = [
      ['{"models": [{"name": "x", "path": "a.gguf",, "device": "cpu"}]}', /models\.json:1:\d+/],
      ['{"models": [\n  {"name": "x",\n   "pathh": "a.gguf"}]}', /models\.json:3: .*unknown field 'pathh'/],
      ['{"models": [{"name": "x", "path": "missing.gguf"}]}', /models\.json:1: .*path.*missing\.gguf/],
      ['{"models": [{"name": "x", "path": "a.gguf"},\n {"name": "x", "path": "b.gguf"}]}', /models\.json:2: .*duplicate/],
      ['{"models": [{"name": "x", "path": "a.gguf", "fallback": "y"},\n {"name": "y", "path": "b.gguf", "fallback": "x"}]}', /loop/],
      ['{"models": [{"name": "x", "path": "a.gguf"}],\n "routes": [{"name": "r", "split": [{"model": "x", "weight": 0}]}]}', /models\.json:2: .*weight/],
      ['{"models": [{"name": "x", "path": "a.gguf", "device": "cuda"}]}', /device 'cuda'/],
    ];
    for (const [text, want] of bad) {
      writeRegistry('models.json', text);
      const r = await postJSON(`${srv.url}/admin/reload`, {});
      assert.equal(r.status, 400, `${text}: ${r.text}`);
      assert.match(r.json.error.message, want);
      const ok = await complete(srv.url, 'main');
      assert.equal(ok.status, 200, 'the running registry stopped serving');
    }
    writeRegistry('models.json', { models: [{ name: 'other', path: MODEL, device: 'cpu' }] });
    assert.equal((await postJSON(`${srv.url}/admin/reload`, {})).status, 200);
    const nf = await complete(srv.url, 'main');
    assert.equal(nf.status, 404);
    assert.match(nf.json.error.message, /available: 'other'/);
  } finally {
    await srv.stop();
  }
});

test("a model's context defaults to the one it was trained for", async () => {
  const short = genModel(path.join(dir, 'short.gguf'), { ctx: 128, seed: 5 });
  const srv = await startServer([], { model: short });
  try {
    const r = await postJSON(`${srv.url}/v1/completions`, { model: 'short', prompt: 'Once', max_tokens: 3000, temperature: 0 });
    assert.equal(r.status, 200, r.text);
    const u = r.json.usage;
    assert.equal(u.prompt_tokens + u.completion_tokens, 128, `not stopped at the trained context: ${JSON.stringify(u)}`);
    assert.equal(r.json.choices[0].finish_reason, 'length');
  } finally {
    await srv.stop();
  }
});

test('keep_alive per request, a directory registry that follows its files, library prompts', async () => {
  const models = path.join(dir, 'dir-models');
  fs.mkdirSync(models);
  genModel(path.join(models, 'one.gguf'), { seed: 11 });
  const srv = await startServer([], { registry: models });
  try {
    const ids = async () => (await (await fetch(`${srv.url}/v1/models`)).json()).data.map((x) => x.id).sort();
    assert.deepEqual(await ids(), ['one']);
    // keep_alive 0: unloaded as soon as the request ends (the janitor's tick: a quarter second).
    assert.equal((await complete(srv.url, 'one', { keep_alive: 0 })).status, 200);
    await sleep(600);
    assert.equal((await state(srv.url)).one, 'unloaded');
    // A file that appears is a model; one that goes is gone (inotify).
    genModel(path.join(models, 'two.gguf'), { seed: 12 });
    const deadline = Date.now() + 10000;
    while ((await ids()).length < 2 && Date.now() < deadline) await sleep(50);
    assert.deepEqual(await ids(), ['one', 'two']);
    fs.rmSync(path.join(models, 'one.gguf'));
    while ((await ids()).length > 1 && Date.now() < deadline + 10000) await sleep(50);
    assert.deepEqual(await ids(), ['two']);
    // A built-in prompt of the library, rendered and sent as the user's message.
    const prompts = (await (await fetch(`${srv.url}/v1/prompts`)).json()).data;
    const story = prompts.find((p) => p.id === 'story');
    assert.ok(story && story.builtin, JSON.stringify(prompts.map((p) => p.id)));
    const r = await postJSON(`${srv.url}/v1/chat/completions`, { model: 'two', prompt: { id: 'story', variables: { topic: 'a cat' } }, max_tokens: 4 });
    assert.equal(r.status, 200, r.text);
    const unknown = await postJSON(`${srv.url}/v1/chat/completions`, { model: 'two', prompt: { id: 'nope' }, max_tokens: 4 });
    assert.equal(unknown.status, 404);
    assert.match(unknown.json.error.message, /story/); // lists the ids there are
    const badVar = await postJSON(`${srv.url}/v1/chat/completions`, { model: 'two', prompt: { id: 'story', variables: { topicc: 'x' } }, max_tokens: 4 });
    assert.equal(badVar.status, 400);
    assert.match(badVar.json.error.message, /topicc/);
  } finally {
    await srv.stop();
  }
});
