// bench.mjs - llama.cpp's speed on one GGUF file, measured through node-llama-cpp
// exactly as `switchboard bench` measures switchboard's, so the two can be put
// side by side:
//
//   node bench.mjs -m FILE [-p 512] [-n 128] [-t 2] [-r 3]
//   node bench.mjs -m FILE --check     (loads the file, evaluates 8 tokens,
//                                       prints {"ok":true,"type":...})
//
//   pp<P>  P tokens (BOS, then P-1 ids from the same xorshift64* stream as
//          switchboard bench) evaluated without generating, on an empty
//          sequence (clearHistory between repetitions); t/s = P / time,
//          ttft_ms = that time.
//   tg<N>  a 16-token prompt, then N greedy tokens: each step decodes the
//          previously chosen token and samples the next with temperature 0.
//          t/s = N / (time from the first chosen token to the N-th decode
//          done); ttft_ms = prompt + the first single-token decode.
//
// One warm-up run, then -r repetitions; prints one JSON array of objects with
// the same fields as `switchboard bench -o json` (peak_rss_mb is the node
// process's maxRSS, which includes node itself, about 50-80 MB). Timing uses
// performance.now() and includes node-llama-cpp's per-call overhead.
import process from "node:process";
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

const TG_PROMPT = 16;

function parseArgs(argv) {
    const o = {model: null, p: 512, n: 128, t: 2, r: 3, check: false};
    for (let i = 0; i < argv.length; i++) {
        const a = argv[i], v = argv[i + 1];
        const num = () => {
            const x = Number(v);
            if (!Number.isInteger(x) || x < 0) throw new Error(`option ${a}: '${v}' is not a non-negative integer`);
            i++;
            return x;
        };
        if (a === "-m") { o.model = v; i++; }
        else if (a === "-p") o.p = num();
        else if (a === "-n") o.n = num();
        else if (a === "-t") o.t = num();
        else if (a === "-r") o.r = num();
        else if (a === "--check") o.check = true;
        else throw new Error(`unknown option '${a}'`);
    }
    if (!o.model) throw new Error("usage: node bench.mjs -m FILE [-p 512] [-n 128] [-t 2] [-r 3]");
    if (o.r < 1) o.r = 1;
    return o;
}

// xorshift64* with switchboard bench's seed: the same token ids in both engines.
function benchTokens(n, nVocab, bos) {
    const M = (1n << 64n) - 1n;
    let s = 0x5eed5b0a4dn;
    const ids = [];
    for (let i = 0; i < n; i++) {
        s ^= s >> 12n;
        s ^= (s << 25n) & M;
        s ^= s >> 27n;
        const r = (s * 0x2545F4914F6CDD1Dn) & M;
        ids.push(Number(r % BigInt(nVocab)));
    }
    if (n > 0 && bos != null && bos >= 0) ids[0] = bos;
    return ids;
}

const ftypeNames = {
    0: "f32", 1: "f16", 2: "q4_0", 3: "q4_1", 7: "q8_0", 8: "q5_0", 9: "q5_1", 10: "q2_k", 11: "q3_k_s",
    12: "q3_k_m", 13: "q3_k_l", 14: "q4_k_s", 15: "q4_k_m", 16: "q5_k_s", 17: "q5_k_m", 18: "q6_k", 32: "bf16",
};

function median(v) {
    const s = [...v].sort((a, b) => a - b);
    const h = s.length >> 1;
    return s.length % 2 ? s[h] : (s[h - 1] + s[h]) / 2;
}

async function timePP(seq, ids) {
    await seq.clearHistory();
    const t0 = performance.now();
    await seq.evaluateWithoutGeneratingNewTokens(ids);
    const s = (performance.now() - t0) / 1e3;
    return {secs: s, ttft: s};
}

async function timeTG(seq, prompt, n) {
    await seq.clearHistory();
    const t0 = performance.now();
    const gen = seq.evaluate(prompt, {temperature: 0, yieldEogToken: true});
    let r = await gen.next(); // prompt decoded, first token chosen
    const t1 = performance.now();
    let ttft = 0;
    for (let i = 0; i < n; i++) {
        r = await gen.next(); // decode the chosen token, choose the next
        if (r.done) throw new Error(`generation stopped after ${i} tokens`);
        if (i === 0) ttft = (performance.now() - t0) / 1e3;
    }
    const secs = (performance.now() - t1) / 1e3;
    await gen.return();
    return {secs, ttft};
}

async function main() {
    const o = parseArgs(process.argv.slice(2));
    const llama = await getLlama({gpu: false, logLevel: LlamaLogLevel.error, build: "never"});
    const model = await llama.loadModel({modelPath: o.model});
    const vocab = model.fileInfo.metadata?.tokenizer?.ggml?.tokens?.length;
    const bos = model.tokens.bos;
    const ftype = model.fileInfo.metadata?.general?.file_type;
    const nCtx = Math.max(o.p, TG_PROMPT + o.n) + 16;
    const ctx = await model.createContext({
        contextSize: nCtx,
        threads: {ideal: o.t, min: o.t},
        batchSize: Math.max(512, o.p),
    });
    const seq = ctx.getSequence();
    const ids = benchTokens(Math.max(o.p, TG_PROMPT), vocab, bos);
    if (o.check) {
        await seq.evaluateWithoutGeneratingNewTokens(ids.slice(0, 8));
        console.log(JSON.stringify({ok: true, model: o.model, type: ftypeNames[ftype] ?? `ftype${ftype}`, n_vocab: vocab}));
        return;
    }
    const out = [];
    for (const [kind, n] of [["pp", o.p], ["tg", o.n]]) {
        if (n === 0) continue;
        const ts = [], tt = [];
        for (let rep = -1; rep < o.r; rep++) {
            const m = kind === "pp" ? await timePP(seq, ids.slice(0, n)) : await timeTG(seq, ids.slice(0, TG_PROMPT), n);
            if (rep >= 0) {
                ts.push(n / m.secs);
                tt.push(m.ttft * 1e3);
            }
            // Same progress line as `switchboard bench --progress` (rep 0 = warm-up).
            console.error(`bench-progress test=${kind}${n} rep=${rep + 1} reps=${o.r} secs=${m.secs.toFixed(4)}` +
                ` t_s=${(n / m.secs).toFixed(3)} ttft_ms=${(m.ttft * 1e3).toFixed(3)}`);
        }
        out.push({
            model: o.model,
            type: ftypeNames[ftype] ?? `ftype${ftype}`,
            threads: o.t,
            test: `${kind}${n}`,
            reps: o.r,
            t_s_median: median(ts),
            t_s_min: Math.min(...ts),
            t_s_max: Math.max(...ts),
            ttft_ms: median(tt),
            peak_rss_mb: process.resourceUsage().maxRSS / 1024,
        });
    }
    console.log(JSON.stringify(out));
    await ctx.dispose();
    await model.dispose();
    await llama.dispose();
}

main().catch((e) => {
    console.error(`bench.mjs: ${e?.message ?? e}`);
    process.exit(1);
});
