# shellcheck shell=bash
# common.sh - shared by bench/compare-llamacpp, bench/compare-batched and
# bench/check-distributions (sourced, not run): locating the build, installing
# node-llama-cpp, building the quantizer and generating / quantizing the
# benchmark models, timing a run beside the other processes' CPU use.
#
# Inputs (set by the caller before sourcing, all optional):
#   SB_BUILD    build directory holding switchboard and bench_logprobs (default <repo>/build)
#   SB_MODELS   model cache directory (default <repo>/bench/models)

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
REPO_DIR=$(dirname "$BENCH_DIR")
LLAMACPP_DIR="$BENCH_DIR/llamacpp"
SB_BUILD=${SB_BUILD:-$REPO_DIR/build}
SB_MODELS=${SB_MODELS:-$BENCH_DIR/models}
NLC_VERSION=3.21.1
LIBLLAMA=

# Benchmark shapes: name -> gen-model arguments (F16, context 2048, seed 1).
declare -A SHAPE_ARGS=(
    [110M]="--dim 768 --hidden 2048 --layers 12 --heads 12 --kv-heads 12 --vocab 32000"
    [1.1B]="--dim 2048 --hidden 5632 --layers 22 --heads 32 --kv-heads 4 --vocab 32000"
)
# Formats: our file-name suffix -> llama.cpp quantizer ftype name (f16 is generated, not quantized).
FORMATS=(f16 q8_0 q4_0 q4_k_m q5_k_m q6_k)

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() {
    printf '%s: error: %s\n' "$(basename "$0")" "$*" >&2
    exit 2
}

# The switchboard binaries (default: switchboard bench_logprobs) must exist: the scripts
# benchmark a build, they do not make one.
require_build() {
    local b
    (($#)) || set -- switchboard bench_logprobs
    for b in "$@"; do
        [[ -x "$SB_BUILD/$b" ]] || die "$SB_BUILD/$b is missing: run 'make build' first (or set SB_BUILD)"
    done
    command -v node >/dev/null || die "node (>= 18) is needed for llama.cpp's side (node-llama-cpp)"
}

# Finds node-llama-cpp@3.21.1 where node will resolve it from bench/llamacpp
# (its own node_modules, or the repository's, which `make test-deps` fills),
# installing it into bench/llamacpp/node_modules if it is in neither; sets LIBLLAMA.
# $SB_LIBLLAMA, if set, names the library instead (the C-API runs need nothing else).
ensure_node_llama_cpp() {
    local d have bins=node_modules/@node-llama-cpp/linux-x64/bins/linux-x64
    if [[ -n ${SB_LIBLLAMA:-} ]]; then
        [[ -f "$SB_LIBLLAMA" ]] || die "SB_LIBLLAMA=$SB_LIBLLAMA: no such file"
        LIBLLAMA=$SB_LIBLLAMA
        return
    fi
    for d in "$LLAMACPP_DIR" "$BENCH_DIR" "$REPO_DIR"; do
        [[ -f "$d/node_modules/node-llama-cpp/package.json" ]] || continue
        have=$(node -p "require('$d/node_modules/node-llama-cpp/package.json').version" 2>/dev/null || true)
        # node stops at the first node_modules that has the package, right version or not
        [[ "$have" == "$NLC_VERSION" && -f "$d/$bins/libllama.v0.4.0.so" ]] && LIBLLAMA="$d/$bins/libllama.v0.4.0.so"
        break
    done
    if [[ -z "$LIBLLAMA" ]]; then
        log "installing node-llama-cpp@$NLC_VERSION into $LLAMACPP_DIR/node_modules (about 700 MB, once)"
        (cd "$LLAMACPP_DIR" && npm i -E --no-audit --no-fund --loglevel=error "node-llama-cpp@$NLC_VERSION" >&2) ||
            die "npm install of node-llama-cpp@$NLC_VERSION failed"
        LIBLLAMA="$LLAMACPP_DIR/$bins/libllama.v0.4.0.so"
        [[ -f "$LIBLLAMA" ]] || die "node-llama-cpp installed, but $LIBLLAMA is missing (not linux-x64?)"
    fi
}

# Builds bench/llamacpp/quantize.c (dlopens libllama) into the model cache.
QUANTIZE_BIN=
build_quantizer() {
    QUANTIZE_BIN="$SB_MODELS/.bin/quantize"
    mkdir -p "$SB_MODELS/.bin"
    if [[ ! -x "$QUANTIZE_BIN" || "$LLAMACPP_DIR/quantize.c" -nt "$QUANTIZE_BIN" ]]; then
        ${CC:-cc} -std=gnu11 -O1 -Wall -Wextra -o "$QUANTIZE_BIN" "$LLAMACPP_DIR/quantize.c" -ldl ||
            die "cannot compile $LLAMACPP_DIR/quantize.c"
    fi
}

# Builds the C driver of llama.cpp's C API (../shared/tools/llbench.c, or $LLBENCH_SRC) into
# the model cache: llama.cpp is timed from a C program that dlopens node-llama-cpp's libllama,
# with nothing of node in the timed process (node's event-loop thread fought ggml's spinning
# workers for the two cores and slowed llama.cpp's generation up to 8x). Sets LLBENCH_BIN.
LLBENCH_BIN=
build_llbench() {
    local src=${LLBENCH_SRC:-$REPO_DIR/../shared/tools/llbench.c}
    [[ -f "$src" ]] || die "$src is missing (set LLBENCH_SRC to llbench.c, the llama.cpp C-API driver)"
    LLBENCH_BIN="$SB_MODELS/.bin/llbench"
    mkdir -p "$SB_MODELS/.bin"
    if [[ ! -x "$LLBENCH_BIN" || "$src" -nt "$LLBENCH_BIN" ]]; then
        ${CC:-cc} -O2 -o "$LLBENCH_BIN" "$src" -ldl -lm 2>/dev/null || die "cannot compile $src"
    fi
}

# run_measured PREFIX TIMEOUT CMD...: runs CMD under `timeout`, stdout to PREFIX.json,
# stderr to PREFIX.err; sets $rc and $others, the share of the machine's CPU time
# (in %, all cores) that other processes used meanwhile: /proc/stat's busy time
# minus the command's own user+system time (GNU time), over wall time x cores.
busy_jiffies() { awk '/^cpu /{print $2+$3+$4+$7+$8+$9; exit}' /proc/stat; }
run_measured() {
    local prefix=$1 limit=$2 b0 b1 t0 t1
    shift 2
    rc=0 others=
    b0=$(busy_jiffies) t0=$(date +%s.%N)
    if [[ -x /usr/bin/time ]]; then
        /usr/bin/time -f '%U %S' -o "$prefix.time" timeout "$limit" "$@" >"$prefix.json" 2>"$prefix.err" || rc=$?
    else
        timeout "$limit" "$@" >"$prefix.json" 2>"$prefix.err" || rc=$?
    fi
    b1=$(busy_jiffies) t1=$(date +%s.%N)
    if [[ -s "$prefix.time" ]]; then
        others=$(awk -v b="$((b1 - b0))" -v t0="$t0" -v t1="$t1" -v n="$(nproc)" \
            -v hz="$(getconf CLK_TCK)" '{ own = $1 + $2 } END { w = t1 - t0; if (w > 0) { x = 100 * (b / hz - own) / (w * n);
            if (x < 0) x = 0; printf "%.0f", x } }' "$prefix.time")
    fi
}

# model_path SHAPE FORMAT -> the cached file's path
model_path() { printf '%s/%s-%s.gguf' "$SB_MODELS" "$1" "$2"; }

# Generates (F16) and quantizes the files of one shape, reusing cached files
# whose recipe (the .recipe next to them) is unchanged. F16 files are checked
# to load and evaluate in llama.cpp before anything is quantized from them.
ensure_models() {
    local shape=$1 f16 recipe fmt out
    f16=$(model_path "$shape" f16)
    recipe="gen-model --type f16 ${SHAPE_ARGS[$shape]} --ctx 2048 --seed 1"
    mkdir -p "$SB_MODELS"
    if [[ ! -f "$f16" || "$(cat "$f16.recipe" 2>/dev/null)" != "$recipe" ]]; then
        log "generating $f16"
        rm -f "$SB_MODELS/$shape"-*
        # shellcheck disable=SC2086
        "$SB_BUILD/switchboard" gen-model --out "$f16.tmp" --type f16 ${SHAPE_ARGS[$shape]} --ctx 2048 --seed 1 ||
            die "gen-model failed for $shape"
        mv "$f16.tmp" "$f16"
        echo "$recipe" >"$f16.recipe"
    fi
    if [[ ! -f "$f16.llama-ok" ]]; then
        node "$LLAMACPP_DIR/bench.mjs" -m "$f16" --check -t 1 >/dev/null ||
            die "llama.cpp cannot load $f16 (generated by switchboard gen-model)"
        touch "$f16.llama-ok"
        log "llama.cpp loads $f16"
    fi
    for fmt in "${FORMATS[@]}"; do
        [[ $fmt == f16 ]] && continue
        out=$(model_path "$shape" "$fmt")
        if [[ ! -f "$out" || "$f16" -nt "$out" ]]; then
            log "quantizing $out with llama.cpp (llama_model_quantize, $fmt)"
            "$QUANTIZE_BIN" "$LIBLLAMA" "$f16" "$out.tmp" "$fmt" "$(nproc)" || die "quantizing $out failed"
            mv "$out.tmp" "$out"
        fi
    done
}
