// The video summarisation job (issue 15): `switchboard batch --summarize`
// on short videos made with ffmpeg's test sources, with scene changes at
// known times, plus a file of random bytes and a truncated video. Checks
// the keyframe times (first frame, scene changes, the minimum gap, the
// cap), caption order, the error lines, the map-reduce split on a small
// context (the number of summary requests), resumption after SIGKILLs
// (the captioner's call log shows nothing recorded was captioned again, the
// keyframe files were not rewritten, the output equals an uninterrupted
// run's), a changed input refused, a failing captioner, and the HTTP
// captioner (a vision endpoint that answers 503 once, then captions).
import test, { after, before } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { BIN, genModel, sleep } from './lib/harness.mjs';

const hasFfmpeg = spawnSync('ffmpeg', ['-version']).status === 0 && spawnSync('ffprobe', ['-version']).status === 0;
// `batch` hands --summarize over to the video pipeline (cmd_batch.c); a
// build without that hand-over says so, and the tests are skipped with why.
const handOver = spawnSync(BIN, ['batch', '--summarize'], { encoding: 'utf8' }).stderr;
const skip = !hasFfmpeg ? 'ffmpeg is not installed'
  : /unknown command|not built/.test(handOver) ? `switchboard batch --summarize is not built: ${handOver.trim()}` : false;
const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sb-video-'));
after(() => fs.rmSync(dir, { recursive: true, force: true }));
const videos = path.join(dir, 'videos');
const model = path.join(dir, 'm.gguf');
const callLog = (name) => path.join(dir, `${name}.calls`);

// Segments of solid colours or testsrc, 10 frames a second: a scene change
// at each segment's start.
function makeVideo(file, segments) {
  const args = ['-y', '-loglevel', 'error'];
  for (const [src, d] of segments) args.push('-f', 'lavfi', '-i', `${src}${src.includes('=') ? ':' : '='}s=160x120:r=10:d=${d}`);
  const inputs = segments.map((_, i) => `[${i}:v]`).join('');
  args.push('-filter_complex', `${inputs}concat=n=${segments.length}:v=1:a=0[v]`, '-map', '[v]', '-c:v', 'mpeg4', '-q:v', '5', file);
  const r = spawnSync('ffmpeg', args, { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`ffmpeg: ${r.stderr}`);
}

// Logs the image it captions to $CAPTION_LOG after an optional delay (so a
// kill lands mid-way), then prints a caption naming the frame; long enough
// that a few fill the small context.
const captioner = path.join(dir, 'caption.sh');
const failing = path.join(dir, 'failing.sh');

before(() => {
  if (skip) return;
  fs.mkdirSync(videos);
  makeVideo(path.join(videos, 'a.mp4'), [['color=c=red', 2], ['color=c=blue', 3], ['testsrc', 2]]);
  // changes at 3 and 3.4: within the 1 s gap, only one is kept
  makeVideo(path.join(videos, 'c.mp4'), [['color=c=red', 3], ['color=c=white', 0.4], ['color=c=black', 3]]);
  // six segments, five changes: the cap of 4 keeps the first frame and three
  const d = [];
  for (let i = 0; i < 6; i++) d.push([`color=c=${['red', 'white', 'blue', 'yellow', 'black', 'green'][i]}`, 1.5]);
  makeVideo(path.join(videos, 'd.mp4'), d);
  fs.writeFileSync(path.join(videos, 'broken.mp4'), Buffer.from(Array.from({ length: 4096 }, (_, i) => (i * 7919) % 251)));
  const whole = fs.readFileSync(path.join(videos, 'a.mp4'));
  fs.writeFileSync(path.join(videos, 'truncated.mp4'), whole.subarray(0, Math.floor(whole.length / 3)));
  fs.writeFileSync(path.join(videos, 'notes.txt'), 'not a video: not listed');
  fs.writeFileSync(captioner, [
    '#!/bin/sh',
    '[ -n "$CAPTION_SLEEP" ] && sleep "$CAPTION_SLEEP"',
    'f=$(basename "$1"); v=$(basename "$(dirname "$1")")',
    'echo "$v/$f" >> "$CAPTION_LOG"',
    'echo "frame $f of $v: a wide view of a plain coloured scene with nothing moving in it at all"',
    '',
  ].join('\n'), { mode: 0o755 });
  fs.writeFileSync(failing, [
    '#!/bin/sh',
    'case "$1" in *kf0001.jpg) echo "no model for this frame" >&2; exit 3;; esac',
    'echo "frame $(basename "$1")"',
    '',
  ].join('\n'), { mode: 0o755 });
  genModel(model, { ctx: 256, seed: 7 });
});

const baseArgs = (out, state, extra = []) => ['batch', '--summarize', videos, '-o', out, '-m', model, '--state-dir', state,
  '--captioner', captioner, '--max-keyframes', '4', '--summary-tokens', '24', '--threads', '1', ...extra];

function run(args, env = {}) {
  const r = spawnSync(BIN, args, { encoding: 'utf8', env: { ...process.env, ...env }, timeout: 300000 });
  return { status: r.status, stderr: r.stderr, signal: r.signal };
}
const readLines = (file) => fs.readFileSync(file, 'utf8').trim().split('\n').map((l) => JSON.parse(l));
const logLines = (file) => (fs.existsSync(file) ? fs.readFileSync(file, 'utf8').trim().split('\n').filter(Boolean) : []);
const near = (a, b, tol = 0.15) => Math.abs(a - b) <= tol;

let reference = null; // the uninterrupted run's output text

test('keyframes at the scene changes, captions in order, error lines, map-reduce on a small context',
  { skip }, () => {
    const out = path.join(dir, 'ref.jsonl');
    const r = run(baseArgs(out, path.join(dir, 'ref.state')), { CAPTION_LOG: callLog('ref') });
    assert.equal(r.status, 0, r.stderr);
    assert.match(r.stderr, /5 videos \(3 ok, 2 failed\)/);
    assert.match(r.stderr, /busy extract [\d.]+s, caption [\d.]+s, summarise [\d.]+s: [\d.]+s of work in [\d.]+s wall/);
    const lines = readLines(out);
    assert.deepEqual(lines.map((l) => path.basename(l.video)), ['a.mp4', 'broken.mp4', 'c.mp4', 'd.mp4', 'truncated.mp4']);
    const [a, broken, c, d, truncated] = lines;

    assert.ok(near(a.duration, 7, 0.2), `duration ${a.duration}`);
    assert.deepEqual(a.keyframes.length, 3, JSON.stringify(a.keyframes));
    [0, 2, 5].forEach((t, i) => assert.ok(near(a.keyframes[i].time, t), `a: keyframe ${i} at ${a.keyframes[i].time}, want ${t}`));
    assert.equal(c.keyframes.length, 2, JSON.stringify(c.keyframes));
    assert.ok(c.keyframes[1].time >= 2.9 && c.keyframes[1].time <= 3.5, `c: ${c.keyframes[1].time}`);
    assert.equal(d.keyframes.length, 4, 'the cap');
    for (const t of d.keyframes.map((k) => k.time)) assert.ok([0, 1.5, 3, 4.5, 6, 7.5].some((x) => near(t, x)), `d: ${t}`);
    for (const v of [a, c, d]) {
      assert.equal(v.error, null);
      assert.equal(typeof v.summary, 'string');
      v.keyframes.forEach((k, i) => assert.match(k.caption, new RegExp(`^frame kf${String(i).padStart(4, '0')}\\.jpg of v\\d{5}:`)));
      for (let i = 1; i < v.keyframes.length; i++) assert.ok(v.keyframes[i].time > v.keyframes[i - 1].time);
    }
    for (const v of [broken, truncated]) {
      assert.equal(v.summary, null);
      assert.deepEqual(v.keyframes, []);
      assert.equal(v.error.stage, 'probe');
      assert.match(v.error.message, /ffprobe cannot read the video \(exit status \d+\): \S/);
    }
    // With 256 tokens of context, three captions do not fit one request:
    // chunk summaries and a summary of them.
    assert.ok(a.summary_requests >= 3, `a: ${a.summary_requests} requests`);
    assert.ok(d.summary_requests > a.summary_requests - 1, `d: ${d.summary_requests} requests`);
    assert.ok(c.summary_requests >= 1);
    // one captioner call per keyframe
    assert.equal(logLines(callLog('ref')).length, 9);
    reference = fs.readFileSync(out, 'utf8');
  });

test('SIGKILL twice mid-caption, then rerun: nothing recorded is extracted or captioned again; the same output',
  { skip }, async () => {
    assert.ok(reference, 'the reference run passed');
    const out = path.join(dir, 'kill.jsonl');
    const state = path.join(dir, 'kill.state');
    const log = callLog('kill');
    const seen = [];
    for (const stopAt of [2, 5]) {
      const p = spawn(BIN, baseArgs(out, state), { env: { ...process.env, CAPTION_LOG: log, CAPTION_SLEEP: '0.3' }, stdio: 'ignore' });
      const exited = new Promise((resolve) => p.on('exit', resolve));
      const deadline = Date.now() + 120000;
      while (logLines(log).length < stopAt && Date.now() < deadline) await sleep(20);
      p.kill('SIGKILL');
      await exited;
      await sleep(500); // an orphaned captioner finishes its sleep and logs
      seen.push(logLines(log).length);
    }
    const kf = path.join(state, 'frames', 'v00000', 'kf0000.jpg');
    const before = fs.statSync(kf);
    const r = run(baseArgs(out, state), { CAPTION_LOG: log });
    assert.equal(r.status, 0, r.stderr);
    const calls = logLines(log);
    // Each kill may cut one caption short after its command logged it; all
    // others were recorded and not asked again.
    const counts = new Map();
    for (const c of calls) counts.set(c, (counts.get(c) || 0) + 1);
    assert.equal(counts.size, 9, [...counts.keys()].join(' '));
    const repeated = [...counts.values()].filter((n) => n > 1).length;
    assert.ok(repeated <= 2, `${repeated} keyframes captioned twice: ${calls.join(' ')}`);
    assert.ok(calls.length <= 9 + 2);
    const after = fs.statSync(kf);
    assert.equal(after.ino, before.ino, 'keyframes were extracted again');
    assert.equal(after.mtimeMs, before.mtimeMs, 'keyframes were extracted again');
    assert.match(r.stderr, /this run: [0-2] extracted/);
    assert.equal(fs.readFileSync(out, 'utf8'), reference);

    // Everything recorded: a rerun asks nothing and writes the same lines.
    const again = run(baseArgs(out, state), { CAPTION_LOG: log });
    assert.equal(again.status, 0, again.stderr);
    assert.match(again.stderr, /this run: 0 extracted, 0 keyframes captioned \(0 errors\), 0 summarised in 0 requests/);
    assert.equal(logLines(log).length, calls.length);
    assert.equal(fs.readFileSync(out, 'utf8'), reference);
  });

test('a context that holds every caption: one request per video', { skip }, () => {
  const big = path.join(dir, 'big.gguf');
  genModel(big, { ctx: 2048, seed: 7 });
  const out = path.join(dir, 'big.jsonl');
  const r = run(['batch', '--summarize', videos, '-o', out, '-m', big, '--state-dir', path.join(dir, 'big.state'),
    '--captioner', captioner, '--max-keyframes', '4', '--summary-tokens', '24', '--threads', '1'], { CAPTION_LOG: callLog('big') });
  assert.equal(r.status, 0, r.stderr);
  const lines = readLines(out);
  assert.deepEqual(lines.map((l) => l.summary_requests), [1, 0, 1, 1, 0]);
  assert.match(r.stderr, /3 summarised in 3 requests/);
});

test('a changed input list under the same state is refused', { skip }, () => {
  const extra = path.join(videos, 'e.mp4');
  fs.copyFileSync(path.join(videos, 'a.mp4'), extra);
  try {
    const r = run(baseArgs(path.join(dir, 'ref2.jsonl'), path.join(dir, 'ref.state')), { CAPTION_LOG: callLog('changed') });
    assert.equal(r.status, 1);
    assert.match(r.stderr, /holds another summarisation job \(line \d+ of the job was '.*' and is now '.*e\.mp4/);
    assert.equal(logLines(callLog('changed')).length, 0);
  } finally {
    fs.rmSync(extra);
  }
});

test('a captioner that cannot be run is refused before the job starts', { skip }, () => {
  const state = path.join(dir, 'nocap.state');
  const r = run(['batch', '--summarize', videos, '-o', path.join(dir, 'nocap.jsonl'), '-m', model, '--state-dir', state,
    '--captioner', 'no-such-captioner-x --fast']);
  assert.equal(r.status, 1);
  assert.match(r.stderr, /--captioner: 'no-such-captioner-x' is not a program that can be run \(not found on PATH\)/);
  assert.ok(!fs.existsSync(path.join(state, 'video.db')), 'no job recorded');
});

test('a failing captioner is an error for its keyframe; the video is still summarised',
  { skip }, () => {
    const list = path.join(dir, 'one.list');
    fs.writeFileSync(list, `# one video\n\n${path.join(videos, 'a.mp4')}\n`);
    const out = path.join(dir, 'fail.jsonl');
    const r = run(['batch', '--summarize', list, '-o', out, '-m', model, '--state-dir', path.join(dir, 'fail.state'),
      '--captioner', `sh ${failing}`, '--threads', '1', '--quiet']);
    assert.equal(r.status, 0, r.stderr);
    assert.equal(r.stderr, '');
    const [a] = readLines(out);
    assert.equal(a.keyframes.length, 3);
    assert.equal(a.keyframes[1].caption, null);
    assert.match(a.keyframes[1].error, /captioner 'sh' exited with status 3: no model for this frame/);
    assert.equal(a.keyframes[0].caption, 'frame kf0000.jpg');
    assert.equal(a.error, null);
    assert.equal(typeof a.summary, 'string');
  });

test('the HTTP captioner: a vision chat request with the frame as a data: URL, 503 retried',
  { skip }, async () => {
    let attempts = 0;
    const seen = [];
    const server = http.createServer((req, res) => {
      let body = '';
      req.on('data', (d) => (body += d));
      req.on('end', () => {
        attempts++;
        if (attempts === 1) {
          res.writeHead(503, { 'content-type': 'application/json' });
          return res.end(JSON.stringify({ error: { message: 'warming up' } }));
        }
        const j = JSON.parse(body);
        seen.push({ url: req.url, auth: req.headers.authorization, model: j.model, content: j.messages[0].content });
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ choices: [{ message: { role: 'assistant', content: `  picture ${seen.length}\n` } }] }));
      });
    });
    await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
    const port = server.address().port;
    const list = path.join(dir, 'http.list');
    fs.writeFileSync(list, `${path.join(videos, 'a.mp4')}\n`);
    const out = path.join(dir, 'http.jsonl');
    const p = spawn(BIN, ['batch', '--summarize', list, '-o', out, '-m', model, '--state-dir', path.join(dir, 'http.state'),
      '--captioner', `http://127.0.0.1:${port}/v1`, '--captioner-model', 'vision-1', '--captioner-key', 'k-123',
      '--threads', '1'], { stdio: ['ignore', 'ignore', 'pipe'] });
    let stderr = '';
    p.stderr.on('data', (d) => (stderr += d));
    const code = await new Promise((resolve) => p.on('exit', resolve));
    server.close();
    assert.equal(code, 0, stderr);
    const [a] = readLines(out);
    assert.deepEqual(a.keyframes.map((k) => k.caption), ['picture 1', 'picture 2', 'picture 3']);
    assert.equal(attempts, 4);
    for (const s of seen) {
      assert.equal(s.url, '/v1/chat/completions');
      assert.equal(s.auth, 'Bearer k-123');
      assert.equal(s.model, 'vision-1');
      assert.equal(s.content[0].type, 'text');
      assert.equal(s.content[1].type, 'image_url');
      const jpeg = Buffer.from(s.content[1].image_url.url.replace(/^data:image\/jpeg;base64,/, ''), 'base64');
      assert.deepEqual([...jpeg.subarray(0, 2)], [0xff, 0xd8], 'a JPEG');
    }
  });
