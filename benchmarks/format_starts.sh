#!/usr/bin/env bash
# Does the number-format choice hold still? Five fresh starts of the same tiny run print their formats;
# the last two start beside two CPU-burning processes (a loaded machine flipped the old timing probe).
#
#     bash benchmarks/format_starts.sh [OUT_DIR]        each start's output in OUT_DIR/start-N.log
#
# The last line is `distinct=<number of different format lines>` (1: the choice did not move).
set -uo pipefail
out=${1:-$(mktemp -d)}
mkdir -p "$out"
cd "$(dirname "$0")/.." || exit 1
python=${PYTHON:-.venv/bin/python}
for i in 1 2 3 4 5; do
    burners=()
    if [ "$i" -ge 4 ]; then
        for _ in 1 2; do "$python" -c "while True: pass" & burners+=($!); done
    fi
    "$python" -m grouprl train --model tiny --total_steps 1 --eval_size 4 --output_dir "$out/run-$i" --overwrite \
        > "$out/start-$i.log" 2>&1
    for p in "${burners[@]}"; do kill "$p"; done
    echo "start $i (${#burners[@]} burners): $(grep -m1 '^formats:' "$out/start-$i.log")"
done
echo "distinct=$(grep -h -m1 '^formats:' "$out"/start-*.log | sort -u | wc -l)"
