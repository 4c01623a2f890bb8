#!/usr/bin/env node
// The video pipeline's overlap: `switchboard batch --summarize` on a set of
// short test videos (ffmpeg's colour and testsrc sources, a scene change
// every 2 s), with a captioner command that takes --caption-ms per frame
// (a stand-in for a vision model) and a generated model summarising. Prints
// the run's stage busy times, their sum and the wall time (overlap = sum /
// wall: 1.0 is no overlap, 3.0 the most three stages can give), with the
// load average (the machine is shared).
//
//   node bench/video-overlap.mjs [--bin build/switchboard] [--videos 8] [--seconds 10]
//                                [--caption-ms 100] [--threads 2] [--summary-tokens 48]
import { execFileSync, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const opt = (name, def) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1] : def;
};
const bin = opt('bin', path.join(root, 'build/switchboard'));
const nVideos = Number(opt('videos', 8));
const seconds = Number(opt('seconds', 10));
const captionMs = Number(opt('caption-ms', 100));
const threads = opt('threads', '2');
const summaryTokens = opt('summary-tokens', '48');

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sb-video-bench-'));
try {
  const videos = path.join(dir, 'videos');
  fs.mkdirSync(videos);
  const colours = ['red', 'blue', 'green', 'white', 'black', 'yellow', 'purple', 'orange'];
  for (let v = 0; v < nVideos; v++) {
    const args = ['-y', '-loglevel', 'error'];
    const segs = Math.max(1, Math.floor(seconds / 2));
    for (let s = 0; s < segs; s++) {
      const src = s % 3 === 2 ? 'testsrc=s=320x240' : `color=c=${colours[(v + s) % colours.length]}:s=320x240`;
      args.push('-f', 'lavfi', '-i', `${src}:r=25:d=2`);
    }
    args.push('-filter_complex', `${Array.from({ length: segs }, (_, i) => `[${i}:v]`).join('')}concat=n=${segs}:v=1:a=0[v]`,
      '-map', '[v]', '-c:v', 'mpeg4', '-q:v', '5', path.join(videos, `v${String(v).padStart(3, '0')}.mp4`));
    execFileSync('ffmpeg', args);
  }
  const cap = path.join(dir, 'cap.sh');
  fs.writeFileSync(cap, `#!/bin/sh\nsleep ${captionMs / 1000}\necho "a frame $(basename "$1") showing a plain scene"\n`, { mode: 0o755 });
  const model = path.join(dir, 'm.gguf');
  execFileSync(bin, ['gen-model', '--out', model, '--type', 'q8_0', '--dim', '256', '--hidden', '768', '--layers', '6',
    '--heads', '8', '--vocab', '2048', '--ctx', '1024', '--seed', '3']);
  const r = spawnSync(bin, ['batch', '--summarize', videos, '-o', path.join(dir, 'out.jsonl'), '-m', model,
    '--captioner', cap, '--threads', threads, '--summary-tokens', summaryTokens], { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(r.stderr);
  const report = r.stderr.split('\n').filter((l) => /videos \(|busy extract/.test(l));
  console.log(`${nVideos} videos of ${seconds} s, captioner ${captionMs} ms/frame, --threads ${threads}`);
  for (const l of report) console.log(l.replace(/^switchboard batch: /, ''));
  console.log(`load average: ${os.loadavg().map((x) => x.toFixed(2)).join(' ')} (${os.cpus().length} cores)`);
} finally {
  fs.rmSync(dir, { recursive: true, force: true });
}
