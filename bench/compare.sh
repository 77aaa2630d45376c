#!/usr/bin/env bash
# Measures what each change bought: runs the bench's floor, toolrelay,
# parallel and memory phases against toolrelay as it was at each commit
# given (the bench itself is this checkout's, so every commit is measured
# the same way), in rounds (every commit once per round, so a machine that
# slows down slows all of them alike, and every other round in reverse
# order), and prints one markdown row per
# commit and round. CPU time per call is the figure to compare: rates on a
# shared machine move with whatever else it runs.
# -bench REV measures with the bench program as it was at REV instead: the
# curves phase (bench/curves*.go) uses APIs commits before it lack, so the
# bench of a commit before it measures those (its phases above are the same),
# with this checkout's go.mod and go.sum.
#   bash bench/compare.sh [-rounds N] [-bench REV] COMMIT...
set -euo pipefail
rounds=2
bench_rev=
while [[ ${1:-} == -* ]]; do
  case $1 in
    -rounds) rounds=$2 ;;
    -bench) bench_rev=$2 ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
  esac
  shift 2
done
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
export GOTOOLCHAIN=local
work=$(mktemp -d)
trap 'for w in "$work"/wt-*; do git worktree remove --force "$w" >/dev/null 2>&1 || true; done; rm -rf "$work"' EXIT
for c in "$@"; do
  git worktree add --detach "$work/wt-$c" "$c" >/dev/null 2>&1
  rm -rf "$work/wt-$c/bench"
  if [[ -n $bench_rev ]]; then
    git archive "$bench_rev" bench | tar -x -C "$work/wt-$c"
    cp bench/go.mod bench/go.sum "$work/wt-$c/bench/" # this checkout's dependencies
  else
    cp -r bench "$work/wt-$c/bench"
  fi
done
echo "| commit | round | CPU per call, single-call turns | turns of 16 | heap objects per call, single-call turns | turns of 16 | floor calls/s | single-call turns | turns of 16 | p50 intake→submission | p99 | 8 × 100 ms p50 | RSS per call at 100k |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
commits=("$@")
for r in $(seq "$rounds"); do
  # Every other round runs the commits in reverse, so none is always the
  # one measured first (or last) in a round.
  order=("${commits[@]}")
  if ((r % 2 == 0)); then
    order=(); for ((i = ${#commits[@]} - 1; i >= 0; i--)); do order+=("${commits[i]}"); done
  fi
  for c in "${order[@]}"; do
    log="$work/log-$c-$r"
    # A commit from before pkg/dispatch/httpapi serves its front door
    # itself (bench/frontdoor_handler.go).
    tags=
    [[ -d $work/wt-$c/pkg/dispatch/httpapi ]] || tags=dispatchhandler
    (cd "$work/wt-$c/bench" && go run -tags "$tags" . -only floor,toolrelay,parallel,memory -out "$work/out-$c-$r" >"$log" 2>&1) ||
      { echo "bench failed at $c:"; tail -5 "$log"; exit 1; }
    awk -v c="$c" -v r="$r" '
      /^   throughput/ { floor = $2; sub(",", "", floor); fcpu = $4 }
      /^   round trip p50/ { sub("ms", "", $4); fp50 = $4; sub("ms", "", $6); fp99 = $6 }
      /^   turns of  1:/ { one = $4; cpu1 = $8; obj1 = $13 }
      /^   turns of 16:/ { sixteen = $4; cpu16 = $8; obj16 = $13 }
      /^   intake to submission/ { sub("ms", "", $5); p50 = $5; sub("ms", "", $7); p99 = $7 }
      /^   8 x 100ms/ { sub("ms", "", $6); par = $6 }
      /^   100000 in-flight calls:/ { sub("[(]", "", $7); mem = $7 }
      END {
        printf "| %s | %s | %.0f µs (%.1f×) | %.0f µs (%.1f×) | %s | %s | %.0f | %.0f (%.2f×) | %.0f (%.2f×) | %.3f ms (%.2f×) | %.3f ms (%.2f×) | %s ms | %s B |\n",
          c, r, cpu1, cpu1 / fcpu, cpu16, cpu16 / fcpu, obj1, obj16, floor, one, one / floor, sixteen, sixteen / floor, p50, p50 / fp50, p99, p99 / fp99, par, mem
      }' "$log"
  done
done
