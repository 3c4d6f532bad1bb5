#!/usr/bin/env bash
# One short GPU check: the CUDA-only tests of the fused attention and of ranking, then the
# attention backends' times and peak memory in bf16 (docs/benchmarks.md, "On a GPU").
#
# Run from the repository root on a machine with a CUDA device and a python3 that has torch,
# numpy and pytest (the attention code needs nothing else):
#     OUT=/tmp/gpu bash benchmarks/gpu_check.sh
# Writes env.txt, pytest.txt, attention.txt and attention.json under $OUT.
#
# The training step is timed by benchmarks/gpu_training.sh (plain nn.Embedding item table: no
# torchrec or fbgemm-gpu needed there).
set -u -o pipefail
OUT=${OUT:-/tmp/gpu}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}

{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  $PY -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name())'
} 2>&1 | tee "$OUT/env.txt"

timeout 240 $PY -m pytest -m gpu -q -p no:cacheprovider \
  tests/model/test_attention.py tests/evaluation/test_eval_ranking.py 2>&1 | tee "$OUT/pytest.txt"

timeout 420 $PY benchmarks/attention.py --device cuda --dtype bfloat16 --budget 65536 \
  --lengths 1024 4096 16384 --backends sdpa flex flex-nobias --repeats 5 --timeout 120 \
  --json "$OUT/attention.json" 2>&1 | tee "$OUT/attention.txt"
