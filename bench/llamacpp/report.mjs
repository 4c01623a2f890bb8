// report.mjs - bookkeeping for bench/compare-llamacpp.
//
//   node report.mjs record --file F --shape S --format X --test T --round K --roofline R
//        --threads N --llama-out J --llama-err E --llama-rc RC --sb-out J --sb-err E --sb-rc RC
//        --sb-timeout SECS --load-before "a b c" --load-after "a b c"
//     prints one JSON line (a result row: one pair) built from the two engines' outputs and
//     bench_roofline's (R, run just before the pair: the host's state).
//     A switchboard run killed by timeout (rc 124) keeps what its
//     --progress lines say: the median of the finished repetitions, or the
//     warm-up, or an upper bound (tokens / seconds) when not even that ended.
//   node report.mjs table RESULTS.jsonl [DIST.json]
//     prints the comparison table (markdown; per file and test, the medians
//     over the rounds and the median of the pairs' ratios, each generation
//     row's bandwidth bound: the file read once per token at the DRAM rate
//     read before its pairs), every pair with its host state, and the
//     distribution check.
import fs from "node:fs";
import path from "node:path";
import process from "node:process";

function readMaybe(p) {
    try {
        return fs.readFileSync(p, "utf8");
    } catch {
        return "";
    }
}

function lastLine(s) {
    const lines = s.split("\n").map((l) => l.trim()).filter((l) => l && !l.startsWith("bench-progress"));
    return lines.length ? lines[lines.length - 1] : "";
}

function median(v) {
    const s = [...v].sort((a, b) => a - b);
    const h = s.length >> 1;
    return s.length % 2 ? s[h] : (s[h - 1] + s[h]) / 2;
}

// One engine's result for one test: {t_s, t_s_min, t_s_max, ttft_ms, rss_mb} or {error} / {partial}.
function engineResult(out, err, rc, test, timeout) {
    if (rc === 0) {
        try {
            const rows = JSON.parse(out);
            const r = rows.find((x) => x.test === test);
            if (r) return {t_s: r.t_s_median, t_s_min: r.t_s_min, t_s_max: r.t_s_max, ttft_ms: r.ttft_ms,
                rss_mb: r.peak_rss_mb};
        } catch {
            /* fall through */
        }
        return {error: `unreadable output: ${out.slice(0, 80)}`};
    }
    if (rc === 124 || rc === 137) {
        const runs = [];
        for (const m of err.matchAll(/bench-progress test=(\S+) rep=(\d+) reps=\d+ secs=(\S+) t_s=(\S+) ttft_ms=(\S+)/g))
            if (m[1] === test) runs.push({rep: Number(m[2]), t_s: Number(m[4]), ttft_ms: Number(m[5])});
        const reps = runs.filter((r) => r.rep > 0);
        const use = reps.length ? reps : runs;
        const n = Number(test.slice(2));
        if (use.length)
            return {t_s: median(use.map((r) => r.t_s)), ttft_ms: median(use.map((r) => r.ttft_ms)),
                partial: `timed out after ${timeout} s; ${reps.length ? `${reps.length} rep(s)` : "warm-up only"}`};
        return {t_s_below: n / timeout, partial: `timed out after ${timeout} s before one run finished`};
    }
    return {error: (lastLine(err) || `exit status ${rc}`).replace(/^(switchboard: error: |bench\.mjs: )/, "")};
}

// The host's state from bench_roofline's output: {dram, l3} read GB/s at
// `threads`, and vnni, the int8 rate at `threads` over `threads` times one
// thread's (~1.0 when the VM's vCPUs have cores of their own, ~0.5 when the
// host runs them on one core's hyperthreads); or null.
function roofline(p, threads) {
    const at = {};
    for (const line of (p ? readMaybe(p) : "").split("\n")) {
        const f = line.trim().split(/\s+/).map(Number);
        if (f.length >= 5 && Number.isInteger(f[0]) && f.every((x) => !Number.isNaN(x))) at[f[0]] = f;
    }
    const f = at[threads];
    if (!f) return null;
    return {dram: f[1], l3: f[2], vnni: at[1] && at[1][4] ? f[4] / (threads * at[1][4]) : null};
}

function record(args) {
    const a = {};
    for (let i = 0; i < args.length; i += 2) a[args[i].replace(/^--/, "")] = args[i + 1];
    const row = {
        file: path.basename(a.file), bytes: fs.statSync(a.file).size, shape: a.shape, format: a.format, test: a.test,
        round: Number(a.round ?? 1), threads: Number(a.threads), host: roofline(a.roofline, Number(a.threads)),
        load_before: a["load-before"], load_after: a["load-after"],
        llama: engineResult(readMaybe(a["llama-out"]), readMaybe(a["llama-err"]), Number(a["llama-rc"]), a.test,
            Number(a["llama-timeout"] ?? 0)),
        switchboard: engineResult(readMaybe(a["sb-out"]), readMaybe(a["sb-err"]), Number(a["sb-rc"]), a.test,
            Number(a["sb-timeout"])),
    };
    // Share of the machine's CPU that other processes used during each run, in %.
    if (a["llama-others"]) row.llama.others_cpu_pct = Number(a["llama-others"]);
    if (a["sb-others"]) row.switchboard.others_cpu_pct = Number(a["sb-others"]);
    console.log(JSON.stringify(row));
}

function fmtTs(r) {
    if (r.error) return "error";
    if (r.t_s_below != null) return `< ${r.t_s_below.toFixed(2)}`;
    const s = r.t_s >= 100 ? r.t_s.toFixed(1) : r.t_s.toFixed(2);
    return r.partial ? `~${s}` : s;
}

// A generation row's bound in t/s from a bandwidth, and what share of it t_s is.
function bound(r, gbs) {
    if (!gbs || !r.bytes || !r.test.startsWith("tg")) return null;
    return (gbs * 1e9) / r.bytes;
}

// One pair's ratio switchboard / llama.cpp: {value, approx} (approx: from a
// run cut short), {below} (an upper bound), or null.
function pairRatio(r) {
    const L = r.llama, S = r.switchboard;
    if (L.t_s && S.t_s) return {value: S.t_s / L.t_s, approx: Boolean(S.partial)};
    if (L.t_s && S.t_s_below) return {below: S.t_s_below / L.t_s};
    return null;
}

function fmtRatio(q) {
    if (!q) return "-";
    return q.below != null ? `< ${q.below.toFixed(3)}` : `${q.approx ? "~" : ""}${q.value.toFixed(3)}`;
}

// What share of its DRAM bound (the file read once per token at the DRAM rate
// read just before the pair) an engine's result reaches, or null.
function ofBound(r, e) {
    const b = bound(r, r.host?.dram);
    return b && e.t_s ? e.t_s / b : null;
}

const fixed = (d) => (x) => (x == null ? "-" : x.toFixed(d));
const share = (x) => (x == null ? "-" : `${Math.round(100 * x)}%`);
// median of the values that are not null, or null
const medianOf = (v) => (v.some((x) => x != null) ? median(v.filter((x) => x != null)) : null);
const range = (v, f) => (v.length ? `${f(Math.min(...v))}-${f(Math.max(...v))}` : "-");

// The rows of one file and test over the rounds, summarised: medians of both
// engines' rates, of the pairs' ratios (the figure) and of their shares of
// the bound; the ratios' and the host's ranges.
function summaryRow(g) {
    // one engine's pairs as one result for fmtTs: the median rate, else the
    // highest upper bound, else an error
    const eng = (k) => {
        const v = g.filter((r) => r[k].t_s).map((r) => r[k].t_s);
        const below = g.filter((r) => r[k].t_s_below != null).map((r) => r[k].t_s_below);
        return fmtTs(v.length ? {t_s: median(v), partial: g.some((r) => r[k].partial)}
            : below.length ? {t_s_below: Math.max(...below)} : {error: true});
    };
    const q = g.map(pairRatio).filter(Boolean), vals = q.filter((x) => x.value != null);
    const ratio = vals.length ? {value: median(vals.map((x) => x.value)), approx: vals.some((x) => x.approx)}
        : q.length ? {below: Math.max(...q.map((x) => x.below))} : null;
    const r0 = g[0];
    const bd = medianOf(g.map((r) => bound(r, r.host?.dram))), bl = medianOf(g.map((r) => bound(r, r.host?.l3)));
    const drams = g.map((r) => r.host?.dram).filter((x) => x != null);
    const ms = fixed(1);
    const others = (k) => Math.max(...g.map((r) => r[k].others_cpu_pct ?? 0));
    const shareOf = (k) => share(medianOf(g.map((r) => ofBound(r, r[k]))));
    return `| ${r0.file} | ${r0.test} | ${g.length} | ${eng("llama")} | ${eng("switchboard")} | ${fmtRatio(ratio)}` +
        ` | ${range(vals.map((x) => x.value), fixed(2))}` +
        ` | ${bd ? `${bd.toFixed(1)}, ${bl.toFixed(1)}` : "-"}` +
        ` | ${bd ? `${shareOf("llama")}, ${shareOf("switchboard")}` : "-"}` +
        ` | ${ms(medianOf(g.map((r) => r.llama.ttft_ms)))} | ${ms(medianOf(g.map((r) => r.switchboard.ttft_ms)))}` +
        ` | ${ms(medianOf(g.map((r) => r.llama.rss_mb)))} | ${ms(medianOf(g.map((r) => r.switchboard.rss_mb)))}` +
        ` | ${others("llama")}, ${others("switchboard")} | ${range(drams, fixed(1))} |`;
}

function pairRow(r) {
    const h = r.host;
    const host = h ? `${h.dram}, ${h.l3}, ${h.vnni == null ? "-" : h.vnni.toFixed(2)}` : "-";
    return `| ${r.file} | ${r.test} | ${r.round ?? 1} | ${fmtTs(r.llama)} | ${fmtTs(r.switchboard)} | ${fmtRatio(pairRatio(r))}` +
        ` | ${host} | ${r.llama.others_cpu_pct ?? "-"}, ${r.switchboard.others_cpu_pct ?? "-"}` +
        ` | ${r.load_before} -> ${r.load_after} |`;
}

function table(resultsPath, distPath) {
    const rows = readMaybe(resultsPath).split("\n").filter(Boolean).map((l) => JSON.parse(l));
    const groups = new Map(); // file and test -> its pairs, in the order of the first round
    for (const r of rows) {
        const k = `${r.file} ${r.test}`;
        if (!groups.has(k)) groups.set(k, []);
        groups.get(k).push(r);
    }
    const out = [];
    out.push("| file | test | pairs | llama.cpp t/s | switchboard t/s | sb / llama | pairs' range" +
        " | tg bound t/s (DRAM, L3) | of bound (llama, sb) | llama ttft ms | sb ttft ms | llama RSS MB | sb RSS MB" +
        " | others' CPU %, most (llama, sb) | DRAM GB/s before the pairs |");
    out.push("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
    for (const g of groups.values()) out.push(summaryRow(g));
    const notes = [];
    for (const r of rows) {
        const at = `${r.file} ${r.test} round ${r.round ?? 1}`;
        if (r.llama.error) notes.push(`${at}: llama.cpp: ${r.llama.error}`);
        if (r.switchboard.error) notes.push(`${at}: switchboard: ${r.switchboard.error}`);
        if (r.switchboard.partial) notes.push(`${at}: switchboard ${r.switchboard.partial}`);
    }
    console.log(out.join("\n"));
    console.log("\nt/s: medians over the pairs; sb / llama: the median of the pairs' ratios (each pair's engines ran" +
        " one after the other), their range beside it.");
    console.log(`tg bound: the file's bytes read once per token at bench_roofline's DRAM rate (1 GiB) and L3 rate` +
        ` (64 MiB repeated) with ${rows[0]?.threads} threads, read just before each pair (median over the pairs);` +
        " of bound: t/s over that pair's DRAM bound, median (above 100%: part of the file stays in the L3 between tokens).");
    console.log("\nEvery pair (host before it: DRAM and L3 read GB/s, int8 VNNI at the threads over the threads times" +
        " one thread's: ~1.0 when the vCPUs have cores of their own, ~0.5 when they share one):\n");
    console.log("| file | test | round | llama.cpp t/s | switchboard t/s | sb / llama | host before: DRAM, L3, VNNI" +
        " | others' CPU % (llama, sb) | loadavg before -> after |");
    console.log("|---|---|--:|--:|--:|--:|---|--:|---|");
    console.log(rows.map(pairRow).join("\n"));
    if (notes.length) {
        console.log("\nNotes:");
        for (const n of notes) console.log(`- ${n}`);
    }
    console.log("\n~ = from the runs that finished before the time limit; < = an upper bound (the first run did not finish).");
    console.log("RSS: llama.cpp's is the node process's peak (node itself adds about 50-80 MB); switchboard's is ru_maxrss.");
    console.log("others' CPU %: the share of all cores' time that other processes used during that engine's run" +
        " (/proc/stat busy time minus the run's own CPU time); above a few % the figures are disturbed, llama.cpp's" +
        " spinning threads most. On a 2-core machine node-llama-cpp's generation is slower with 2 threads than with" +
        " 1 (node's event loop competes with ggml's spinning threads): see bench/README.md.");
    if (distPath && fs.existsSync(distPath)) {
        const d = JSON.parse(fs.readFileSync(distPath, "utf8"));
        console.log("\nTeacher-forced distribution check (max over positions of max|dlogp| / spread of llama.cpp's logp):");
        console.log("| file | type | worst | at pos | median | limit | verdict |");
        console.log("|---|---|--:|--:|--:|--:|---|");
        const pct = (x) => (x == null ? "-" : `${(100 * x).toFixed(3)}%`);
        for (const r of d) {
            const verdict = r.status === "ok" ? (r.pass === null ? "info" : "PASS") : r.status === "fail" ? "FAIL" :
                `ERROR: ${r.error}`;
            console.log(`| ${path.basename(r.file)} | ${r.type} | ${pct(r.worst_ratio)} | ${r.worst_pos ?? "-"} |` +
                ` ${pct(r.median_ratio)} | ${r.tolerance == null ? "-" : pct(r.tolerance)} | ${verdict} |`);
        }
    }
}

const [cmd, ...rest] = process.argv.slice(2);
if (cmd === "record") record(rest);
else if (cmd === "table") table(rest[0], rest[1]);
else {
    console.error("usage: node report.mjs record ... | table RESULTS.jsonl [DIST.json]");
    process.exit(2);
}
