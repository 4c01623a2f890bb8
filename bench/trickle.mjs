// Trickling sockets against a normal client (issue 17, done-when 4): rounds
// of a quiet p99 of small sequential completions, then the same p99 while
// 1,000 sockets each send one byte of a request head per second, until the
// header deadline closes them. Prints each round, the medians, and whether
// the loaded p99 stays within 2x of the quiet one. A benchmark, not a test:
// quote the load average beside its figures (docs/RELIABILITY.md).
//   node bench/trickle.mjs [--rounds 5] [--sockets 1000] [--header-timeout 6]
//                          [--model ../shared/models/stories260K.gguf] [--bin build/switchboard]
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, '..');
const arg = (name, def) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1] : def;
};
const rounds = Number(arg('rounds', 5));
const sockets = Number(arg('sockets', 1000));
const deadline = Number(arg('header-timeout', 6));
process.env.SB_BIN = arg('bin', process.env.SB_BIN || path.join(root, 'build/switchboard'));
const model = arg('model', path.resolve(root, '../shared/models/stories260K.gguf'));
const { startServer } = await import('../tests/server/lib/harness.mjs');
const { completionP99, trickleSockets } = await import('../tests/server/lib/trickle.mjs');

const srv = await startServer(['--threads', '2', '--header-timeout', String(deadline), '--max-connections',
  String(sockets + 200)], { model });
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const rows = [];
try {
  await completionP99(srv.url, 50, 0, 3); // warm up
  for (let r = 0; r < rounds; r++) {
    const load = os.loadavg()[0];
    // The same window for both: the deadline less a margin for opening the sockets.
    const quiet = await completionP99(srv.url, 100, deadline - 2, deadline - 1.5);
    const t = trickleSockets(srv.port, sockets);
    await t.opened;
    const loaded = await completionP99(srv.url, 100, deadline - 2, deadline - 1.5);
    const closedAfter = await t.closed;
    await t.stop();
    rows.push({ quiet: quiet.p99, loaded: loaded.p99, q50: quiet.p50, l50: loaded.p50, closedAfter, load });
    console.log(`round ${r + 1}: p99 quiet ${quiet.p99.toFixed(2)} ms, with ${sockets} trickling ${loaded.p99.toFixed(2)} ms ` +
      `(x${(loaded.p99 / quiet.p99).toFixed(2)}; p50 ${quiet.p50.toFixed(2)} / ${loaded.p50.toFixed(2)}); ` +
      `closed ${closedAfter.toFixed(1)} s after opening (deadline ${deadline} s); load ${load.toFixed(2)}`);
  }
} finally {
  await srv.stop();
}
const mq = median(rows.map((x) => x.quiet)), ml = median(rows.map((x) => x.loaded));
const ratio = median(rows.map((x) => x.loaded / x.quiet));
const closed = Math.max(...rows.map((x) => x.closedAfter));
console.log(`median p99: quiet ${mq.toFixed(2)} ms, loaded ${ml.toFixed(2)} ms; median ratio x${ratio.toFixed(2)} ` +
  `(${ratio <= 2 ? 'within' : 'NOT within'} 2x); slowest close ${closed.toFixed(1)} s (deadline ${deadline} s); ` +
  `load average ${fs.readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).join(' ')}`);
