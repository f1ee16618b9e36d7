#!/usr/bin/env bash
# The chat page's committed build (serve/webui/dist/, what the binary embeds) must be what its
# sources build to: installs the locked npm packages, rebuilds, and fails on any difference.
# Needs node and npm (Debian's are installed when missing and this runs as root).
set -euo pipefail
cd "$(dirname "$0")/../serve/webui"
if ! command -v npm >/dev/null && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  { DEBIAN_FRONTEND=noninteractive apt-get install -y -q nodejs npm >&2 ||
    { apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q nodejs npm >&2; }; }
fi
npm ci --no-audit --no-fund --loglevel=error
node build.mjs
if [ -n "$(git status --porcelain -- dist)" ]; then
  git status --porcelain -- dist >&2
  git diff --stat -- dist >&2
  echo "error: serve/webui/dist is not what its sources build to: run 'npm ci && npm run build' in serve/webui and commit dist/" >&2
  exit 1
fi
echo "serve/webui/dist matches its sources"
