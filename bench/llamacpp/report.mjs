// report.mjs - bookkeeping for bench/compare-llamacpp.
//
//   node report.mjs record --file F --shape S --format X --test T --threads N
//        --llama-out J --llama-err E --llama-rc RC --sb-out J --sb-err E --sb-rc RC
//        --sb-timeout SECS --load-before "a b c" --load-after "a b c"
//     prints one JSON line (a result row) built from the two engines' outputs.
//     A switchboard run killed by timeout (rc 124) keeps what its
//     --progress lines say: the median of the finished repetitions, or the
//     warm-up, or an upper bound (tokens / seconds) when not even that ended.
//   node report.mjs table RESULTS.jsonl [DIST.json] [ROOFLINE.txt]
//     prints the comparison table (markdown) and the distribution check;
//     with bench_roofline's output of the same run, each generation row's
//     bandwidth bound (the file read once per token) and what each engine
//     reaches of it.
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

function record(args) {
    const a = {};
    for (let i = 0; i < args.length; i += 2) a[args[i].replace(/^--/, "")] = args[i + 1];
    const row = {
        file: path.basename(a.file), bytes: fs.statSync(a.file).size, shape: a.shape, format: a.format, test: a.test, threads: Number(a.threads),
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

// bench_roofline's read bandwidths (GB/s) at `threads`: {dram, l3}, or null.
function roofline(p, threads) {
    for (const line of readMaybe(p).split("\n")) {
        const f = line.trim().split(/\s+/).map(Number);
        if (f.length >= 3 && f[0] === threads) return {dram: f[1], l3: f[2]};
    }
    return null;
}

// A generation row's bound in t/s from a bandwidth, and what share of it t_s is.
function bound(r, gbs) {
    if (!gbs || !r.bytes || !r.test.startsWith("tg")) return null;
    return (gbs * 1e9) / r.bytes;
}

function table(resultsPath, distPath, rooflinePath) {
    const rows = readMaybe(resultsPath).split("\n").filter(Boolean).map((l) => JSON.parse(l));
    const roof = rows.length ? roofline(rooflinePath, rows[0].threads) : null;
    const out = [];
    out.push("| file | test | llama.cpp t/s | switchboard t/s | sb / llama | tg bound t/s (DRAM, L3) | of bound (llama, sb)" +
        " | llama ttft ms | sb ttft ms | llama RSS MB | sb RSS MB | others' CPU % (llama, sb) | loadavg before -> after |");
    out.push("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|");
    const notes = [];
    for (const r of rows) {
        const L = r.llama, S = r.switchboard;
        let ratio = "-";
        if (L.t_s && S.t_s) ratio = (S.t_s / L.t_s).toFixed(3);
        else if (L.t_s && S.t_s_below) ratio = `< ${(S.t_s_below / L.t_s).toFixed(3)}`;
        if (S.partial && S.t_s) ratio = `~${ratio}`;
        const ms = (x) => (x == null ? "-" : x.toFixed(1));
        const bd = bound(r, roof?.dram), bl = bound(r, roof?.l3);
        const of = (e) => (bd && e.t_s ? `${Math.round((100 * e.t_s) / bd)}%` : "-");
        const bounds = bd ? `${bd.toFixed(1)}, ${bl.toFixed(1)}` : "-";
        out.push(`| ${r.file} | ${r.test} | ${fmtTs(L)} | ${fmtTs(S)} | ${ratio} | ${bounds} | ${bd ? `${of(L)}, ${of(S)}` : "-"}` +
            ` | ${ms(L.ttft_ms)} | ${ms(S.ttft_ms)}` +
            ` | ${ms(L.rss_mb)} | ${ms(S.rss_mb)} | ${L.others_cpu_pct ?? "-"}, ${S.others_cpu_pct ?? "-"}` +
            ` | ${r.load_before} -> ${r.load_after} |`);
        if (L.error) notes.push(`${r.file} ${r.test}: llama.cpp: ${L.error}`);
        if (S.error) notes.push(`${r.file} ${r.test}: switchboard: ${S.error}`);
        if (S.partial) notes.push(`${r.file} ${r.test}: switchboard ${S.partial}`);
    }
    console.log(out.join("\n"));
    if (notes.length) {
        console.log("\nNotes:");
        for (const n of notes) console.log(`- ${n}`);
    }
    if (roof)
        console.log(`\ntg bound: the file's bytes read once per token at bench_roofline's ${roof.dram} GB/s (1 GiB, DRAM)` +
            ` and ${roof.l3} GB/s (64 MiB repeated, L3) with ${rows[0].threads} threads, measured at the start of this run;` +
            " of bound: t/s over the DRAM bound (above 100%: part of the file stays in the L3 between tokens).");
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
else if (cmd === "table") table(rest[0], rest[1], rest[2]);
else {
    console.error("usage: node report.mjs record ... | table RESULTS.jsonl [DIST.json] [ROOFLINE.txt]");
    process.exit(2);
}
