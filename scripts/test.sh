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
# The real researcher CLIs (codex, claude, gemini), pinned, into .cache/npm (not globally).
bash scripts/install_clis.sh
# Training jobs run under bubblewrap (executors/sandbox.py); its tests skip without it.
if ! command -v bwrap >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap; } >/dev/null 2>&1 \
    || echo "could not install bubblewrap: the sandbox tests will be skipped" >&2
fi
exec "$PY" -m pytest -q "$@"
