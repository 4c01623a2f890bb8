#!/usr/bin/env bash
# libswitchboard as an embedder gets it: `cmake --install` into a temporary
# prefix, then
#   - the prefix holds the libraries, switchboard.pc and include/switchboard.h only;
#   - the shared library exports exactly the functions switchboard.h declares;
#   - every examples/*.c compiles with nothing but
#     `cc ex.c $(pkg-config --cflags --libs switchboard)` and runs against a
#     generated model (and one links statically with `pkg-config --static`).
# Usage: install.sh BUILD_DIR SOURCE_DIR (CTest: library_install; $SB_BIN is the CLI).
set -euo pipefail
build=$1
src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

prefix=$tmp/prefix
cmake --install "$build" --prefix "$prefix" >/dev/null
pc=$(find "$prefix" -name switchboard.pc)
[ -n "$pc" ] || fail "no switchboard.pc installed"
export PKG_CONFIG_PATH=$(dirname "$pc")
headers=$(cd "$prefix/include" && find . -type f | sort)
[ "$headers" = "./switchboard.h" ] || fail "installed headers are not just switchboard.h: $headers"
so=$(find "$prefix" -name libswitchboard.so | head -1)
[ -n "$so" ] && [ -n "$(find "$prefix" -name libswitchboard.a)" ] || fail "shared or static library not installed"

# Exports: the defined dynamic symbols against the functions the header declares.
nm -D --defined-only "$so" | awk '{print $NF}' | grep -vxE '_init|_fini' | sort -u >"$tmp/exported"
grep -oE '\bsb_[a-z0-9_]+\(' "$src/include/switchboard.h" | tr -d '(' | sort -u >"$tmp/declared"
extra=$(comm -23 "$tmp/exported" "$tmp/declared")
missing=$(comm -13 "$tmp/exported" "$tmp/declared")
[ -z "$extra" ] || fail "the shared library exports symbols switchboard.h does not declare: $(echo $extra)"
[ -z "$missing" ] || fail "switchboard.h declares functions the shared library does not export: $(echo $missing)"
echo "exports: $(wc -l <"$tmp/exported") sb_ functions, all declared in switchboard.h"

# A small generated model, and a registry serving it under two names with a fallback.
"$SB_BIN" gen-model --out "$tmp/demo.gguf" --type q8_0 --dim 64 --hidden 128 --layers 2 --heads 4 --vocab 512 \
    --ctx 256 --seed 1 >/dev/null
cat >"$tmp/models.json" <<JSON
{"fallback": "demo",
 "models": [{"name": "demo", "path": "demo.gguf", "device": "cpu"},
            {"name": "demo-copy", "path": "demo.gguf", "aliases": ["copy"]}]}
JSON

cd "$tmp"
for ex in "$src"/examples/*.c; do
    name=$(basename "$ex" .c)
    # shellcheck disable=SC2046 # word splitting of pkg-config's flags is the point
    cc -std=c11 -Wall -Wextra -Werror "$ex" $(pkg-config --cflags --libs switchboard) -o "$name" ||
        fail "$name.c does not compile against the installed library"
done
cc -std=c11 "$src/examples/infer.c" $(pkg-config --cflags switchboard) \
    $(pkg-config --static --libs switchboard | sed 's/-lswitchboard/-l:libswitchboard.a/') -o infer_static ||
    fail "infer.c does not link statically with pkg-config --static"

export LD_LIBRARY_PATH=$(dirname "$so")
run() { # NAME ARGS...: runs an example, keeps its output in NAME.out
    local name=$1
    shift
    "./$name" "$@" >"$name.out" 2>&1 || { cat "$name.out" >&2; fail "$name $* exited with $?"; }
}
expect() { grep -q -- "$2" "$1.out" || { cat "$1.out" >&2; fail "$1: no '$2' in its output"; }; }
run infer demo.gguf "Once upon a time"
expect infer "\[model demo, "
ldd ./infer_static | grep -q libswitchboard && fail "infer_static is linked to the shared library"
run infer_static demo.gguf
cmp -s infer.out infer_static.out || fail "infer and infer_static disagree"
run streaming demo.gguf
expect streaming "token events"
run switch models.json copy no-such-model demo
expect switch "copy: served by 'demo-copy'"
expect switch "no-such-model: served by the fallback 'demo' (unknown model 'no-such-model')"
expect switch "default model now: demo;"
run switch . demo no-such-model   # a directory: no fallback there
expect switch "no-such-model: no such model: "
run batch demo.gguf
expect batch "4. The sun was -> "
run profiler demo.gguf
expect profiler "first call (loads the model)"
expect profiler "last_profile: 64 generated tokens"
echo "examples: $(ls "$src"/examples/*.c | wc -l) built against the installed library and run"
