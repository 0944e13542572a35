#!/usr/bin/env bash
# Run one set-up phase and print how long it took: phase.sh NAME "COMMAND".
set -euo pipefail
name=$1; shift
start=$(date +%s%N)
bash -c "$*" 2> >(grep -v "Location .* is ignored: it is neither" >&2)
end=$(date +%s%N)
awk -v n="$name" -v ns="$((end - start))" 'BEGIN { printf "[setup] %-12s %6.1f s\n", n, ns / 1e9 }'
