// tokenize.mjs - llama.cpp's tokenizer speed, measured through node-llama-cpp
// on the text bench_tokenize (bench/tokenize.c) writes, so the two can be put
// side by side:
//
//   build/bench_tokenize --text-out /tmp/text.txt
//   node bench/llamacpp/tokenize.mjs -m MODEL.gguf -f /tmp/text.txt [-r 5] [--ids-out /tmp/ids.bin]
//   build/bench_tokenize --ids-in /tmp/ids.bin     # same ids?
//
// The text is tokenized -r times with model.tokenize(text) (llama_tokenize
// with add_special and parse_special off, as bench_tokenize calls
// sb_vocab_tokenize); after one warm-up call the best time is reported as
// MB/s (10^6 bytes) in one JSON object. The time includes node-llama-cpp's
// per-call overhead (passing the string in, the ids out as a Uint32Array),
// which is small next to a 1 MB text. --ids-out writes the ids as int32
// little endian for bench_tokenize --ids-in to compare.
import fs from "node:fs";
import process from "node:process";
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

function parseArgs(argv) {
    const o = {model: null, file: null, r: 5, idsOut: null};
    for (let i = 0; i < argv.length; i++) {
        const a = argv[i], v = argv[i + 1];
        if (v === undefined) throw new Error(`option ${a} needs a value`);
        if (a === "-m") o.model = v;
        else if (a === "-f") o.file = v;
        else if (a === "-r") o.r = Math.max(1, Number.parseInt(v, 10) || 1);
        else if (a === "--ids-out") o.idsOut = v;
        else throw new Error(`unknown option '${a}'`);
        i++;
    }
    if (!o.model || !o.file)
        throw new Error("usage: node tokenize.mjs -m MODEL.gguf -f TEXT [-r 5] [--ids-out PATH]");
    return o;
}

const o = parseArgs(process.argv.slice(2));
const bytes = fs.readFileSync(o.file);
const text = bytes.toString("utf8");
const llama = await getLlama({gpu: false, logLevel: LlamaLogLevel.error, build: "never"});
const t0 = performance.now();
const model = await llama.loadModel({modelPath: o.model, gpuLayers: 0});
const loadS = (performance.now() - t0) / 1e3;

let ids = model.tokenize(text); // warm-up
let best = Infinity;
for (let r = 0; r < o.r; r++) {
    const t = performance.now();
    ids = model.tokenize(text);
    best = Math.min(best, (performance.now() - t) / 1e3);
}
if (o.idsOut) fs.writeFileSync(o.idsOut, Buffer.from(Int32Array.from(ids).buffer));

console.log(JSON.stringify({
    engine: "llama.cpp (node-llama-cpp)",
    model: o.model,
    bytes: bytes.length,
    tokens: ids.length,
    reps: o.r,
    best_s: Number(best.toFixed(6)),
    mb_per_s: Number((bytes.length / best / 1e6).toFixed(2)),
    load_s: Number(loadS.toFixed(3)),
}));
await model.dispose();
await llama.dispose();
