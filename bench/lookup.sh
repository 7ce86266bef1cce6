#!/usr/bin/env bash
# Token lookup on the real models: each method with lookup off, on and auto in one process
# (the same loaded weights, modes in turn on each session), per data set:
#   readme    the README example (tests/data/sample-session.json)
#   smoke     the six smoke sessions of the evaluation data
#   coding12  the 12 shortest coding sessions of the evaluation data's dev file
# Usage: bash bench/lookup.sh [SET...]   (default: all three; a set whose report exists is
# skipped, so an interrupted run resumes). Env: TARGET, DRAFTER, MODES, METHODS_<SET>,
# EVALDATA, THREADS.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=./target/release/speccompact
[ -x "$bin" ] || cargo build --release -p speccompact-cli
data=${EVALDATA:-../shared/evaldata/dev}
target=${TARGET:-qwen2.5-coder-1.5b-instruct}
drafter=${DRAFTER:-smollm2-135m-instruct}
modes=${MODES:-off,on,auto}
threads=${THREADS:-2}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

python3 - "$data" "$tmp" <<'EOF'
import json, sys
data, tmp = sys.argv[1], sys.argv[2]
with open("tests/data/sample-session.json") as f:
    readme = json.load(f)
with open(f"{tmp}/readme.jsonl", "w") as f:
    f.write(json.dumps(readme) + "\n")
rows = [json.loads(l) for l in open(f"{data}/sessions.jsonl")]
coding = sorted((r for r in rows if r["kind"] == "coding"), key=lambda r: (r["stats"]["chars"], r["id"]))
with open(f"{tmp}/coding12.jsonl", "w") as f:
    for r in coding[:12]:
        f.write(json.dumps({"id": r["id"], "messages": r["messages"]}) + "\n")
EOF
cp "$data/smoke.jsonl" "$tmp/smoke.jsonl"

sets=("$@")
[ ${#sets[@]} -gt 0 ] || sets=(readme smoke coding12)
for set in "${sets[@]}"; do
  out=bench/results/lookup-$set-${target%%-instruct}
  if [ -f "$out.json" ]; then
    echo "$set: $out.json exists, skipped"
    continue
  fi
  var=METHODS_${set^^}
  methods=${!var:-$([ "$set" = coding12 ] && echo sequential || echo sequential,speculative)}
  "$bin" --threads "$threads" --lookup "$modes" bench --data "$tmp/$set.jsonl" \
    --methods "$methods" --drafter "$drafter" --target "$target" \
    --out "$out.md" --json "$out.json"
done
