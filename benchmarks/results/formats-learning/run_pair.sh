#!/bin/bash
# usage: run_pair.sh arith|agent SEED [extra overrides...]
demo=$1; seed=$2; shift 2
cd /work/learn
if [ "$demo" = agent ]; then flag="--agent"; else flag="--eval_every 4"; fi
for f in bf16 fp32; do
  name=$demo-$f-s$seed
  ( s=$(date +%s.%N); PYTHONPATH=/work/learn/src nice -n 5 /work/main/.venv/bin/python -m grouprl demo $flag \
      --dtype $f --num_threads 1 --rollout_engine hf --seed $seed --output_dir /work/learn/runs/$name "$@" \
      > logs/$name.log 2>&1; rc=$?; e=$(date +%s.%N); echo "$name rc=$rc wall_s=$(echo "$e - $s" | bc)" >> logs/walls.txt ) &
done
wait
