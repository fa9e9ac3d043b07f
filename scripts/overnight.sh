#!/usr/bin/env bash
# Start a run for the night in a detached tmux session, with a live status pane beside it.
#   scripts/overnight.sh TAG [harness run options...]
#   e.g. scripts/overnight.sh mar5 --agent codex --model gpt-5.4 --hours 8
# Attach with `tmux attach -t harness-TAG`; the run survives a closed terminal or ssh session.
set -euo pipefail
if [ $# -lt 1 ]; then
  echo "usage: $0 TAG [harness run options...]" >&2
  exit 2
fi
tag=$1
shift
command -v tmux >/dev/null || { echo "tmux is not installed (apt-get install tmux)" >&2; exit 1; }
command -v harness >/dev/null || { echo "harness is not installed (bash scripts/install.sh)" >&2; exit 1; }
session="harness-$tag"
repo=$(pwd)
resume=""
if git -C "$repo" rev-parse --verify --quiet "refs/heads/autoresearch/$tag" >/dev/null; then
  resume="--resume"  # started before: continue where it stopped
fi
run_cmd=$(printf '%q ' harness run --repo "$repo" --tag "$tag" $resume "$@")
tmux new-session -d -s "$session" -c "$repo" "$run_cmd; echo 'run ended; press enter'; read"
# The status pane waits for the run's first row (the baseline trains first) and stays open if
# it ever ends, so its last words can be read.
status_cmd=$(printf '%q ' harness status "$tag" --repo "$repo" --watch)
tmux split-window -h -t "$session" -c "$repo" "$status_cmd; echo 'status ended; press enter'; read"
tmux select-pane -t "$session:0.0"
echo "started $session: tmux attach -t $session"
