#!/usr/bin/env bash
# Installs what switchboard builds and tests with, if anything is missing:
# Debian packages (compiler, CMake, libraries), and the npm test peers of
# package.json (llama.cpp through node-llama-cpp, the official OpenAI client)
# into ./node_modules. Safe to run repeatedly; does nothing when all is there.
#   --no-npm   skip the npm peers (enough to build and run switchboard)
set -euo pipefail
cd "$(dirname "$0")/.."
pkgs=(build-essential cmake pkg-config libcmocka-dev libcjson-dev libpcre2-dev libutf8proc-dev libmicrohttpd-dev
      libsqlite3-dev libhiredis-dev libssl-dev libcurl4-openssl-dev # keys, usage, jobs (SQLite), Redis, hashing, the captioner client
      redis-server ffmpeg # the shared cache and limits tests; the video pipeline's keyframes
      python3 python3-pytest # the Python module's tests (python/)
      clang libclang-rt-14-dev) # clang and its libFuzzer runtime: the fuzz harnesses (tests/fuzz/)
# Test tools: promtool (in Debian's prometheus package) lints the /metrics exposition.
[ "${1:-}" = "--no-npm" ] || pkgs+=(prometheus)
[ "${1:-}" = "--no-npm" ] || command -v npm >/dev/null || pkgs+=(nodejs npm)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}" >&2
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
[ "${1:-}" = "--no-npm" ] && exit 0
# The lock file pins exact versions; reinstall when it changed.
if [ ! -f node_modules/.package-lock.json ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  echo "installing npm test peers (node-llama-cpp, openai)" >&2
  npm ci --no-audit --no-fund --loglevel=error >/dev/null
fi
