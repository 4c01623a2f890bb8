// kquants.mjs - K-quant models and `switchboard quantize` against llama.cpp
// (node-llama-cpp@3.21.1's libllama):
//   1. a random llama model (F16, rows of 256: every K-quant applies) and the
//      stories260K fixture (F32, rows of 64 and 172: llama.cpp's fallbacks)
//      are quantized to every type `switchboard quantize` knows, by llama.cpp's
//      own llama_model_quantize (bench/llamacpp/quantize.c, compiled here) and
//      by switchboard; every tensor's type and bytes, general.file_type and
//      general.quantization_version must be equal (stories260K's q2_k and
//      q3_k_m fall back to q4_0, its iq4_xs to iq4_nl: its rows are not a
//      multiple of 256); a model with 4 query heads per KV head and 8 layers
//      takes the rules that depend on them (q2_k's and the iq4 types' attn_v,
//      the iq4 types' first ffn_down);
//   2. the Q4_K_M, Q5_K_M and Q6_K files made by llama.cpp (two Q4_K_M ones of models whose
//      output is their embedding table: a Q6_K table, and a Q8_0 one with Q5_0 layers), and an
//      IQ4_NL one (which its quantizer wrote for the Q2_K and Q3_K matrices whose rows are not a
//      multiple of 256, before it took Q4_0 for them: files people have) and an IQ4_XS one decode
//      greedily to the same first tokens in both engines (at least 8 of 32, or fewer and
//      then two tokens within 3% of our distribution's spread: random
//      quantized models meet near-ties), and their teacher-forced next-token
//      distributions agree within 3% (bench/llamacpp/distributions.mjs).
//
// usage: node kquants.mjs   (env SB_BIN, SB_SHARED_DIR, SB_LOGPROBS; ctest sets them;
// SB_LIBLLAMA: another libllama.v0.4.0.so than node_modules')
import {execFileSync, spawnSync} from 'node:child_process';
import {mkdtempSync, readFileSync, rmSync} from 'node:fs';
import {tmpdir} from 'node:os';
import {dirname, join} from 'node:path';
import {fileURLToPath} from 'node:url';
import {getLlama, LlamaLogLevel} from 'node-llama-cpp';

const bin = process.env.SB_BIN;
const shared = process.env.SB_SHARED_DIR;
const logprobs = process.env.SB_LOGPROBS;
if (!bin || !shared || !logprobs) {
    console.error('set SB_BIN, SB_SHARED_DIR and SB_LOGPROBS (ctest does)');
    process.exit(2);
}
const repo = join(dirname(fileURLToPath(import.meta.url)), '../..');
const libllama = process.env.SB_LIBLLAMA ||
                 join(repo, 'node_modules/@node-llama-cpp/linux-x64/bins/linux-x64/libllama.v0.4.0.so');
const types = ['q8_0', 'q4_0', 'q4_1', 'q5_0', 'q5_1', 'q2_k', 'q3_k_m', 'q4_k_m', 'q5_k_m', 'q6_k', 'iq4_nl', 'iq4_xs'];
const dir = mkdtempSync(join(tmpdir(), 'sb-kquants-'));
// On every exit, a failed check's or a thrown error's as well.
process.on('exit', () => rmSync(dir, {recursive: true, force: true}));
let failures = 0, checks = 0;
const check = (ok, line) => {
    checks++;
    if (!ok)
        failures++;
    console.log(`${ok ? 'ok  ' : 'FAIL'} ${line}`);
};

// The tensors (name -> {type, bytes}) and metadata of a GGUF, from `switchboard info`.
function readGguf(path) {
    const info = execFileSync(bin, ['info', path], {encoding: 'utf8', maxBuffer: 1 << 26});
    const dataAt = Number(/data at offset (\d+)/.exec(info)[1]);
    const file = readFileSync(path);
    const kv = {}, tensors = {};
    for (const m of info.matchAll(/^ {2}(general\.(?:file_type|quantization_version))\s+\S+\s+(\d+)$/gm))
        kv[m[1]] = Number(m[2]);
    for (const m of info.matchAll(/^ {2}(\S+)\s+(\S+)\s+\[[\d, ]+\]\s+(\d+)\s+(\d+)$/gm)) {
        const off = dataAt + Number(m[3]);
        tensors[m[1]] = {type: m[2], bytes: file.subarray(off, off + Number(m[4]))};
    }
    return {kv, tensors};
}

function compare(label, ours, theirs) {
    const a = readGguf(ours), b = readGguf(theirs);
    const diffs = [];
    for (const k of ['general.file_type', 'general.quantization_version'])
        if (a.kv[k] !== b.kv[k])
            diffs.push(`${k} ${a.kv[k]} vs ${b.kv[k]}`);
    const names = new Set([...Object.keys(a.tensors), ...Object.keys(b.tensors)]);
    for (const n of names) {
        const x = a.tensors[n], y = b.tensors[n];
        if (!x || !y)
            diffs.push(`${n} only in ${x ? 'switchboard' : 'llama.cpp'}'s`);
        else if (x.type !== y.type)
            diffs.push(`${n}: ${x.type} vs llama.cpp ${y.type}`);
        else if (!x.bytes.equals(y.bytes))
            diffs.push(`${n} (${x.type}): bytes differ`);
    }
    check(diffs.length === 0, `${label}: ${names.size} tensors` + (diffs.length ? `\n     ${diffs.slice(0, 5).join('\n     ')}` : ''));
}

const quantizer = join(dir, 'llama-quantize');
execFileSync('cc', ['-std=gnu11', '-O1', '-o', quantizer, join(repo, 'bench/llamacpp/quantize.c'), '-ldl']);
const timed = (cmd, args) => {
    const t = process.hrtime.bigint();
    const r = spawnSync(cmd, args, {encoding: 'utf8'});
    return {...r, secs: Number(process.hrtime.bigint() - t) / 1e9};
};

const gen = join(dir, 'gen-f16.gguf');
execFileSync(bin, ['gen-model', '--out', gen, '--type', 'f16', '--vocab-from', join(shared, 'models/llama2-vocab-tiny-random.gguf'),
                   '--dim', '256', '--hidden', '512', '--layers', '4', '--heads', '4', '--kv-heads', '2', '--ctx', '256',
                   '--seed', '13']);
const inputs = [['gen-f16', gen], ['stories260K', join(shared, 'models/stories260K.gguf')]];
const made = {};
let tOurs = 0, tTheirs = 0;
// `input` quantized to `type` by both, compared; llama.cpp's file (in made), or null.
const quantizeBoth = (label, input, type) => {
    const theirs = join(dir, `${label}-${type}-llama.gguf`), ours = join(dir, `${label}-${type}-sb.gguf`);
    const l = timed(quantizer, [libllama, input, theirs, type, '2']);
    const s = timed(bin, ['quantize', input, ours, type, '--threads', '2']);
    tTheirs += l.secs;
    tOurs += s.secs;
    if (l.status !== 0 || s.status !== 0) {
        check(false, `${label} ${type}: llama.cpp exit ${l.status}, switchboard exit ${s.status}\n${l.stderr}${s.stderr}`);
        return null;
    }
    compare(`${label} ${type}`, ours, theirs);
    return (made[`${label}-${type}`] = theirs);
};
for (const [label, input] of inputs)
    for (const type of types)
        quantizeBoth(label, input, type);
// 8 query heads on 2 KV heads, 8 layers: q2_k's attn_v q4_K (q3_K below 4 heads per KV head), the
// iq4 types' attn_v and first ffn_down q5_K.
const gqa = join(dir, 'gen-gqa4-f16.gguf');
execFileSync(bin, ['gen-model', '--out', gqa, '--type', 'f16', '--vocab-from', join(shared, 'models/llama2-vocab-tiny-random.gguf'),
                   '--dim', '256', '--hidden', '512', '--layers', '8', '--heads', '8', '--kv-heads', '2', '--ctx', '256',
                   '--seed', '19']);
for (const [type, bumped, n] of [['q2_k', 'q4_K', 8], ['iq4_nl', 'q5_K', 9], ['iq4_xs', 'q5_K', 9]]) {
    const theirs = quantizeBoth('gen-gqa4', gqa, type);
    const got = theirs ? Object.values(readGguf(theirs).tensors).filter((x) => x.type === bumped).length : 0;
    check(got === n, `gen-gqa4 ${type}: ${got} ${bumped} matrices (${n} expected)`);
}

// Models whose output matrix is their embedding table (gemma2's files have no output.weight, as
// Llama 3.2 1B's and Qwen2.5's small ones), which switchboard packs for the output product and
// looks rows up in: rows of 256 make the table Q6_K; rows of 288 (not a multiple of 256, as
// Qwen2.5 0.5B's 896) make it Q8_0, and most layer matrices Q5_0 (Q4_K_M) or Q4_0 (Q3_K_M),
// llama.cpp's fallbacks.
for (const [dim, type, fallback] of [[256, 'q4_k_m', null], [288, 'q4_k_m', 'q5_0'], [288, 'q3_k_m', 'q4_0']]) {
    const label = `gen-tied${dim}`, tiedIn = join(dir, `${label}-f16.gguf`);
    execFileSync(bin, ['gen-model', '--out', tiedIn, '--type', 'f16', '--arch', 'gemma2', '--vocab-from',
                       join(shared, 'models/llama2-vocab-tiny-random.gguf'), '--dim', String(dim), '--hidden', '512',
                       '--layers', '4', '--heads', '4', '--kv-heads', '2', '--ctx', '256', '--seed', '17']);
    const theirs = quantizeBoth(label, tiedIn, type);
    if (!theirs)
        continue;
    const t = readGguf(theirs).tensors, table = fallback ? 'q8_0' : 'q6_K';
    const n = Object.values(t).filter((x) => x.type === fallback).length;
    check(t['token_embd.weight']?.type === table && !t['output.weight'] && (!fallback || n > 0),
          `${label} ${type}: token_embd.weight ${t['token_embd.weight']?.type} (${table} expected), ` +
          `no output.weight` + (fallback ? `, ${n} ${fallback} matrices` : ''));
}
console.log(`quantizing time, all files: switchboard ${tOurs.toFixed(2)} s, llama.cpp ${tTheirs.toFixed(2)} s (2 threads each, process start included)`);

// Refusals: an already-quantized input, a missing or unknown type.
{
    const q = made['gen-f16-q8_0'], out = join(dir, 'requant.gguf');
    const r = spawnSync(bin, ['quantize', q, out, 'q4_0'], {encoding: 'utf8'});
    check(r.status === 1 && /already quantized/.test(r.stderr), 'an already-quantized input is refused');
    const w = spawnSync(bin, ['quantize', q, out, 'q4_0', '--allow-requantize'], {encoding: 'utf8'});
    check(w.status === 0 && /warning: requantizing/.test(w.stderr), '--allow-requantize requantizes, with a warning');
    const m = spawnSync(bin, ['quantize', gen, out], {encoding: 'utf8'});
    check(m.status === 2 && /TYPE is missing/.test(m.stderr), 'a missing TYPE is a usage error');
    const u = spawnSync(bin, ['quantize', gen, out, 'q7_k'], {encoding: 'utf8'});
    check(u.status === 2 && /unknown TYPE 'q7_k'/.test(u.stderr), 'an unknown TYPE is a usage error');
    const f = spawnSync(bin, ['quantize', gen, '/dev/full', 'q4_0'], {encoding: 'utf8'});
    check(f.status === 1, 'an unwritable output fails with a message: ' + f.stderr.trim().split('\n').pop());
}

// How far apart our log-probabilities of tokens a and b are after ids, relative to the
// spread of that distribution (the measure of bench/llamacpp/distributions.mjs).
const TIE = 0.03;
function tieGap(model, ids, a, b) {
    const out = join(dir, 'tie.f32');
    execFileSync(logprobs, ['-m', model, '-o', out, '-t', '1', ...ids.map(String)], {stdio: ['ignore', 'ignore', 'inherit']});
    const all = new Float32Array(readFileSync(out).buffer.slice(0));
    const row = all.subarray(all.length - all.length / ids.length);
    let lo = Infinity, hi = -Infinity;
    for (const v of row) {
        lo = Math.min(lo, v);
        hi = Math.max(hi, v);
    }
    return Math.abs(row[a] - row[b]) / (hi - lo);
}

// The K-quant files from llama.cpp's quantizer, run by both engines.
const llama = await getLlama({gpu: false, logLevel: LlamaLogLevel.error, build: 'never'});
const prompts = ['Once upon a time', 'The capital of France is'];
const N = 32, MIN_SAME = 8;
const kfiles = [...['q4_k_m', 'q5_k_m', 'q6_k', 'iq4_nl', 'iq4_xs'].map((t) => `gen-f16-${t}`), 'gen-tied256-q4_k_m',
                'gen-tied288-q4_k_m', 'gen-tied288-q3_k_m']
                   .map((k) => made[k]).filter(Boolean);
for (const path of kfiles) {
    const model = await llama.loadModel({modelPath: path});
    for (const prompt of prompts) {
        // an F16 KV cache, as llama.cpp's: random quantized models are sensitive to the last bits
        const ours = JSON.parse(execFileSync(bin, ['run', '-m', path, '-p', prompt, '-n', String(N), '--temp', '0',
                                                   '--json', '-t', '1', '--cache-type', 'f16'],
                                             {stdio: ['ignore', 'pipe', 'ignore']}));
        const ctx = await model.createContext({contextSize: 256, threads: 1});
        const theirs = [];
        for await (const tok of ctx.getSequence().evaluate(ours.prompt_ids, {temperature: 0})) {
            if (model.isEogToken(tok) || theirs.push(tok) === N)
                break;
        }
        await ctx.dispose();
        let same = 0;
        while (same < theirs.length && ours.gen_ids[same] === theirs[same])
            same++;
        // Random quantized models meet near-ties within a few dozen tokens (both engines
        // round differently outside the matrix products, and llama.cpp's own order depends
        // on the CPU: its AMX kernels where the CPU has AMX); the first MIN_SAME must agree,
        // or part where our two candidates are a near-tie, and the teacher-forced check
        // below bounds every position's distribution.
        const name = `${path.split('/').pop()} ${JSON.stringify(prompt)}`;
        if (same >= Math.min(MIN_SAME, theirs.length)) {
            check(true, `${name}: ${same}/${theirs.length} greedy tokens equal` +
                        (same < theirs.length ? ` (first ${MIN_SAME} required)` : ''));
        } else {
            const gap = tieGap(path, [...ours.prompt_ids, ...ours.gen_ids.slice(0, same)], ours.gen_ids[same],
                               theirs[same]);
            check(gap < TIE, `${name}: ${same}/${theirs.length} greedy tokens equal, then a near-tie: ` +
                             `our log-probabilities of the two tokens ${(100 * gap).toFixed(2)}% of their ` +
                             `spread apart (under ${100 * TIE}% required)`);
        }
    }
    await model.dispose();
}
const script = join(repo, 'bench/llamacpp/distributions.mjs');
try {
    console.log(execFileSync(process.execPath, [script, '--logprobs', logprobs, '-t', '1', '--tokens', '64', ...kfiles],
                             {encoding: 'utf8'}).trimEnd());
    check(true, 'teacher-forced distributions within the limits');
} catch (e) {
    console.log(`${e.stdout || ''}${e.stderr || ''}`.trimEnd());
    check(false, 'teacher-forced distributions within the limits');
}
console.log(`${checks - failures} passed, ${failures} failed`);
process.exit(failures ? 1 : 0);
