#!/usr/bin/env bash
# Install the real researcher CLIs, pinned, into the project's cache (.cache/npm), for the tests
# that drive them offline. Idempotent: a package already there at its version is skipped.
# A package that cannot be had is reported; the tests that need it skip with the reason.
set -uo pipefail
cd "$(dirname "$0")/.."
PREFIX=.cache/npm
PACKAGES=("@openai/codex@0.171.0" "@anthropic-ai/claude-code@2.1.197" "@google/gemini-cli@0.61.0")
if ! command -v npm >/dev/null 2>&1; then
  echo "npm is not installed: the tests of the real codex/claude/gemini CLIs will be skipped" >&2
  exit 0
fi
mkdir -p "$PREFIX"
for spec in "${PACKAGES[@]}"; do
  name=${spec%@*}
  version=${spec##*@}
  have=$(node -p "require('./$PREFIX/node_modules/$name/package.json').version" 2>/dev/null || true)
  if [ "$have" = "$version" ]; then
    continue
  fi
  if ! timeout 600 npm install --prefix "$PREFIX" --no-audit --no-fund --loglevel=error "$spec" >&2; then
    echo "could not install $spec: its real-CLI tests will be skipped" >&2
  fi
done
exit 0
