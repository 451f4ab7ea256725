#!/bin/bash
# Session 10, second call (issue 6), ~8 min, carry [".device_wheels"]. The first call
# (next_run.sh) put LoKR 512 and LoRA r64 within run-to-run spread at batch 1 (91.9-95.0 vs
# 93.4-93.9 ms). This call: (1) Muon's update alone on the 2B factors with the new
# "bfloat16_batched" Newton-Schulz against "tf32" (time and deviation from float64);
# (2) both adapters at batch 1 with each precision, and with AdamW (whose update costs the same
# per parameter for both), 30 timed steps a row, each row in its own process, LoKR and LoRA
# alternating so drift lands on both. 2B, 6000 frames, CUDA graphs. When it ran, "auto" was still
# "tf32"; its tf32 rows now name the precision (the same rows).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout 60 python3 bench/muon_bench.py --models 2b --adapters lora64,lokr512 --precisions tf32,bfloat16_batched --repeat 10 --out $OUT/muon.json > $OUT/muon.log 2>&1; echo "muon rc=$?"
B="python3 bench/dit_bench.py --steps 30 --warmup 5 --compile reduce-overhead --models 2b --crops 6000 --batches 1 --optimizer-time"
timeout 150 $B --adapters lokr512 --muon-ns-precision bfloat16_batched --time-budget-s 140 --out $OUT/lokr_bf16.json > $OUT/lokr_bf16.log 2>&1; echo "lokr bf16 rc=$?"
timeout 70 $B --adapters lora64 --muon-ns-precision bfloat16_batched --time-budget-s 62 --out $OUT/lora_bf16.json > $OUT/lora_bf16.log 2>&1; echo "lora bf16 rc=$?"
timeout 70 $B --adapters lora64 --muon-ns-precision tf32 --time-budget-s 62 --out $OUT/lora_tf32.json > $OUT/lora_tf32.log 2>&1; echo "lora tf32 rc=$?"
timeout 70 $B --adapters lokr512 --muon-ns-precision tf32 --time-budget-s 62 --out $OUT/lokr_tf32.json > $OUT/lokr_tf32.log 2>&1; echo "lokr tf32 rc=$?"
timeout 85 $B --adapters lokr512 --optimizer adamw --time-budget-s 77 --out $OUT/lokr_adamw.json > $OUT/lokr_adamw.log 2>&1; echo "lokr adamw rc=$?"
timeout 75 $B --adapters lora64 --optimizer adamw --time-budget-s 67 --out $OUT/lora_adamw.json > $OUT/lora_adamw.log 2>&1; echo "lora adamw rc=$?"
cat $OUT/muon.log | cut -c1-300
for f in lokr_bf16 lora_bf16 lora_tf32 lokr_tf32 lokr_adamw lora_adamw; do echo "$f: $(grep -h '"step_ms"\|"error": "[^"]' $OUT/$f.log | cut -c1-330)"; done
