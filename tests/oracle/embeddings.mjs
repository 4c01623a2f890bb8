// embeddings.mjs - /v1/embeddings against llama.cpp (node-llama-cpp@3.21.1)
// with mean pooling: the fixture models carry no pooling type (llama.cpp then
// returns the last token's state), so a copy of each gets
// "<arch>.pooling_type" = 1 (mean) in its metadata; llama.cpp embeds each
// input with it, switchboard's server embeds the same inputs, and the
// vectors (both made unit length) must agree: cosine similarity >= 0.99999
// on F32 weights, >= 0.9995 on Q8_0 (the engines round activations
// differently). With last-token pooling instead the cosines are 0.5-0.8.
//
// usage: node embeddings.mjs   (env SB_BIN, SB_SHARED_DIR; ctest sets them)
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { getLlama, LlamaLogLevel } from 'node-llama-cpp';
import { startServer, postJSON } from '../server/lib/harness.mjs';

const shared = process.env.SB_SHARED_DIR;
if (!process.env.SB_BIN || !shared) {
  console.error('set SB_BIN and SB_SHARED_DIR (ctest does)');
  process.exit(2);
}

// A copy of a GGUF file with one more uint32 metadata entry (appended after
// the others; tensor offsets are relative to the data section, which moves
// to the next alignment boundary).
function withU32(file, key, value) {
  const b = readFileSync(file);
  let p = 24;
  const u64 = () => { const v = Number(b.readBigUInt64LE(p)); p += 8; return v; };
  const u32 = () => { const v = b.readUInt32LE(p); p += 4; return v; };
  const size = [1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8];
  let alignment = 32;
  const skip = (t) => {
    if (t === 8) { const n = u64(); p += n; }
    else if (t === 9) { const et = u32(), n = u64(); for (let i = 0; i < n; i++) skip(et); }
    else p += size[t];
  };
  const nTensors = Number(b.readBigUInt64LE(8)), nKv = Number(b.readBigUInt64LE(16));
  for (let i = 0; i < nKv; i++) {
    const k = b.toString('utf8', p + 8, p + 8 + Number(b.readBigUInt64LE(p)));
    p += 8 + k.length;
    const t = u32();
    if (k === 'general.alignment') alignment = b.readUInt32LE(p);
    skip(t);
  }
  const kvEnd = p;
  for (let i = 0; i < nTensors; i++) { const len = u64(); p += len; const nd = u32(); p += 8 * nd + 4 + 8; }
  const infoEnd = p, dataStart = Math.ceil(infoEnd / alignment) * alignment;
  const kb = Buffer.from(key);
  const kv = Buffer.alloc(8 + kb.length + 4 + 4);
  kv.writeBigUInt64LE(BigInt(kb.length), 0);
  kb.copy(kv, 8);
  kv.writeUInt32LE(4, 8 + kb.length);
  kv.writeUInt32LE(value, 12 + kb.length);
  const head = Buffer.concat([b.subarray(0, kvEnd), kv, b.subarray(kvEnd, infoEnd)]);
  head.writeBigUInt64LE(BigInt(nKv + 1), 16);
  const pad = Buffer.alloc(Math.ceil(head.length / alignment) * alignment - head.length);
  return Buffer.concat([head, pad, b.subarray(dataStart)]);
}

const inputs = ['Once upon a time', 'The little dog ran to the park and played with a ball.', 'hello'];
const dir = mkdtempSync(join(tmpdir(), 'sb-embd-'));
// On every exit, a failed check's or a thrown error's as well.
process.on('exit', () => rmSync(dir, { recursive: true, force: true }));
const llama = await getLlama({ gpu: false, logLevel: LlamaLogLevel.error, build: 'never' });
let failures = 0;
for (const [name, arch, least] of [['stories260K', 'llama', 0.99999], ['stories260K-q8_0', 'llama', 0.9995]]) {
  const path = join(dir, `${name}.gguf`);
  writeFileSync(path, withU32(join(shared, `models/${name}.gguf`), `${arch}.pooling_type`, 1));
  const model = await llama.loadModel({ modelPath: path });
  const ctx = await model.createEmbeddingContext({ contextSize: 256 });
  const srv = await startServer(['--threads', '2'], { model: path });
  try {
    const ours = await postJSON(`${srv.url}/v1/embeddings`, { model: name, input: inputs });
    if (ours.status !== 200) throw new Error(`switchboard: ${ours.status} ${ours.text}`);
    for (let i = 0; i < inputs.length; i++) {
      const theirs = (await ctx.getEmbeddingFor(inputs[i])).vector;
      const a = ours.json.data[i].embedding;
      const norm = Math.hypot(...theirs);
      const cos = a.reduce((s, x, j) => s + x * theirs[j], 0) / norm / Math.hypot(...a);
      const ok = a.length === theirs.length && cos >= least;
      console.log(`${ok ? 'ok  ' : 'FAIL'} ${name} ${JSON.stringify(inputs[i])}: cosine ${cos.toFixed(6)} (${a.length} dims)`);
      failures += !ok;
    }
  } finally {
    await srv.stop();
    await ctx.dispose();
    await model.dispose();
  }
}
process.exit(failures ? 1 : 0);
