#!/usr/bin/env bash
# The README's first-run cost, measured: a fresh clone of the committed HEAD in a temporary
# directory, then the README's commands in order, each timed. Writes results/first-run/first_run.md and
# results/first-run/first_run.json here. COLD=1 runs pip with an empty download cache (everything is
# downloaded, as on a new machine); otherwise pip's cache is used as it is.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
if [ "${COLD:-0}" = 1 ]; then
  export PIP_CACHE_DIR="$work/pip-cache"
  cache="empty (COLD=1: every package downloaded)"
else
  cache="pip's existing download cache"
fi
clone="$work/gmpo"
git clone -q "$repo" "$clone"
cd "$clone"
commit="$(git rev-parse --short HEAD)"
log="$work/log"
: > "$log"
declare -A secs
step() {  # step NAME COMMAND...: run, time, keep the last lines of its output
  local name="$1"; shift
  local t0 t1
  t0=$(date +%s.%N)
  "$@" > "$work/out" 2>&1
  t1=$(date +%s.%N)
  secs[$name]=$(python3 -c "print(f'{$t1 - $t0:.1f}')")
  # progress bars redraw with carriage returns: keep their last state
  { echo "\$ $*    # ${secs[$name]} s"; tr '\r' '\n' < "$work/out" | grep -v '^ *$' | tail -n 3
    echo; } >> "$log"
}
step setup make setup
step train make train
step help .venv/bin/gmpo --help
step train_help .venv/bin/gmpo train --help
step docs make docs
venv_gb=$(du -sk .venv | python3 -c "import sys; print(f'{int(sys.stdin.read().split()[0]) * 1024 / 1e9:.1f}')")
final=$(python3 -c "import json; s = json.load(open('runs/train/summary.json')); print(f\"{s['reward_first']:.2f} -> {s['reward_final']:.2f}\")")
date=$(date -u +"%Y-%m-%d %H:%M UTC")
cpu=$(grep -m1 "model name" /proc/cpuinfo | cut -d: -f2 | xargs || true)
mkdir -p "$repo/results/first-run"
cat > "$repo/results/first-run/first_run.json" <<JSON
{"date_utc": "$date", "commit": "$commit", "pip_cache": "$cache", "cpus": $(nproc),
 "setup_s": ${secs[setup]}, "train_s": ${secs[train]}, "help_s": ${secs[help]},
 "train_help_s": ${secs[train_help]}, "docs_s": ${secs[docs]}, "venv_gb": $venv_gb,
 "train_reward": "$final"}
JSON
{
  echo "# First run from a fresh clone ($date)"
  echo
  echo "\`make first-run\` (scripts/first_run.sh): \`git clone\` of commit $commit, then the"
  echo "README's commands in order. $(nproc) CPUs ($cpu), shared; pip cache: $cache."
  echo
  echo "| step | seconds |"
  echo "|---|---:|"
  echo "| make setup (.venv: ${venv_gb} GB) | ${secs[setup]} |"
  echo "| make train (reward $final) | ${secs[train]} |"
  echo "| gmpo --help | ${secs[help]} |"
  echo "| gmpo train --help | ${secs[train_help]} |"
  echo "| make docs | ${secs[docs]} |"
  echo
  echo "Transcript (last lines of each command):"
  echo
  echo '```text'
  cat "$log"
  echo '```'
} > "$repo/results/first-run/first_run.md"
echo "wrote $repo/results/first-run/first_run.md"
