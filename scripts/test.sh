#!/usr/bin/env bash
# Install the package with its test extras and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
bash scripts/install.sh "[test]"
# The HTML report test screenshots the page in headless Chromium (Debian's package).
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } >/dev/null 2>&1 \
    || echo "could not install chromium: the HTML screenshot test will be skipped" >&2
fi
# The screen tests run `harness run`, `harness ab` and scripts/overnight.sh in tmux panes.
if ! command -v tmux >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq tmux; } >/dev/null 2>&1 \
    || echo "could not install tmux: the screen tests will be skipped" >&2
fi
exec "$PY" -m pytest -q "$@"
