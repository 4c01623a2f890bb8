#!/usr/bin/env bash
# Installs the Debian packages switchboard builds and tests with, if any is
# missing. Safe to run repeatedly; does nothing when all are present.
set -euo pipefail
pkgs=(build-essential cmake pkg-config libcmocka-dev libcjson-dev libpcre2-dev libutf8proc-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing: ${missing[*]}" >&2
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
