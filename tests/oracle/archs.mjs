// archs.mjs - every architecture switchboard runs, checked against llama.cpp
// (node-llama-cpp@3.21.1): a random model of each family is generated with
// `switchboard gen-model` (F32, the Llama 2 vocabulary); both engines decode
// greedily from the same prompt ids and the token sequences must be equal;
// then the teacher-forced next-token distributions along a 64-token
// sequence must agree within 1% (bench/llamacpp/distributions.mjs).
//
// usage: node archs.mjs   (env SB_BIN: the switchboard binary; SB_SHARED_DIR:
// fixtures; SB_LOGPROBS: bench_logprobs; ctest sets all three)
import {execFileSync} from 'node:child_process';
import {mkdtempSync, rmSync} from 'node:fs';
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
const vocab = join(shared, 'models/llama2-vocab-tiny-random.gguf');
const archs = ['llama', 'qwen2', 'qwen3', 'phi3', 'gemma2'];
const prompts = ['Once upon a time', 'The capital of France is', 'def fibonacci(n):'];
const N = 32;

const dir = mkdtempSync(join(tmpdir(), 'sb-archs-'));
// On every exit, a failed check's or a thrown error's as well.
process.on('exit', () => rmSync(dir, {recursive: true, force: true}));
const llama = await getLlama({gpu: false, logLevel: LlamaLogLevel.error, build: 'never'});
let failures = 0;
const files = [];
for (const arch of archs) {
    const path = join(dir, `${arch}.gguf`);
    files.push(path);
    execFileSync(bin, ['gen-model', '--out', path, '--arch', arch, '--vocab-from', vocab, '--dim', '128',
                       '--hidden', '320', '--layers', '3', '--heads', '4', '--kv-heads', '2', '--ctx', '256',
                       '--seed', '11']);
    const model = await llama.loadModel({modelPath: path});
    for (const prompt of prompts) {
        const ours = JSON.parse(execFileSync(bin, ['run', '-m', path, '-p', prompt, '-n', String(N), '--temp', '0',
                                                   '--json', '-t', '1'], {stdio: ['ignore', 'pipe', 'ignore']}));
        const ctx = await model.createContext({contextSize: 256, threads: 1});
        const seq = ctx.getSequence();
        const theirs = [];
        for await (const tok of seq.evaluate(ours.prompt_ids, {temperature: 0})) {
            if (model.isEogToken(tok))
                break;
            theirs.push(tok);
            if (theirs.length === N)
                break;
        }
        await ctx.dispose();
        let same = 0;
        while (same < N && ours.gen_ids[same] === theirs[same] && same < theirs.length)
            same++;
        const ok = same === theirs.length && same === ours.gen_ids.length;
        console.log(`${ok ? 'ok  ' : 'FAIL'} ${arch.padEnd(7)} ${JSON.stringify(prompt).padEnd(28)} ${same}/${theirs.length} tokens equal` +
                    (ok ? '' : `\n     llama.cpp:   ${theirs.join(' ')}\n     switchboard: ${ours.gen_ids.join(' ')}`));
        if (!ok)
            failures++;
    }
    await model.dispose();
}

const script = join(dirname(fileURLToPath(import.meta.url)), '../../bench/llamacpp/distributions.mjs');
let distOk = true;
try {
    console.log(execFileSync(process.execPath, [script, '--logprobs', logprobs, '-t', '1', '--tokens', '64', ...files],
                             {encoding: 'utf8'}).trimEnd());
} catch (e) {
    console.log(`${e.stdout || ''}${e.stderr || ''}`.trimEnd());
    distOk = false;
}
if (!distOk)
    failures++;
const total = archs.length * prompts.length + 1;
console.log(`${total - failures} passed, ${failures} failed`);
process.exit(failures ? 1 : 0);
