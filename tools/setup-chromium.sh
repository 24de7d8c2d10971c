#!/usr/bin/env bash
# Headless Chromium for the report test (Debian's package). Idempotent and quiet:
# does nothing when chromium is already installed.
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "setup-chromium: chromium is missing; install it with: sudo apt-get install -y chromium" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
command -v chromium >/dev/null
