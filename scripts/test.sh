#!/usr/bin/env bash
# Install the package with its test extras and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
bash scripts/install.sh "[test]"
# Debian packages the suite drives for real: chromium (the HTML report's screenshot), bubblewrap
# (the sandbox, executors/sandbox.py), tmux (the screen and overnight.sh tests). Their tests skip
# with the reason when one cannot be had.
missing=()
for pair in chromium:chromium bwrap:bubblewrap tmux:tmux; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair#*:}")
done
if [ ${#missing[@]} -gt 0 ] && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"; } >/dev/null 2>&1 \
    || echo "could not install ${missing[*]}: the tests that need them will be skipped" >&2
fi
# The real researcher CLIs (codex, claude, gemini), pinned, into .cache/npm (not globally).
bash scripts/install_clis.sh
# The harness's own modules compiled once: every `harness` process the tests start (hundreds) then
# reads their bytecode, also where PYTHONDONTWRITEBYTECODE is set and nothing would cache it.
"$PY" -m compileall -q harness >/dev/null
# Four workers (pytest-xdist) on a two-core machine: the tests that wait (a researcher's timeout,
# a server's start, a sleeping trainer) leave the cores to the others; with three, the CPU stood
# idle for 14% of the run (the waiting tests of three workers met), with four for 5%. The Ray
# tests share one worker (tests/conftest.py, SERIAL_GROUPS). HARNESS_TEST_WORKERS=0 runs everything in one process.
exec "$PY" -m pytest -q -n "${HARNESS_TEST_WORKERS:-4}" --dist loadgroup "$@"
