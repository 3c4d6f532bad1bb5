#!/usr/bin/env bash
# One short GPU check (< 8 minutes on an H200): the CUDA-only tests of the fused attention and
# of ranking, then the attention table in bf16 (docs/benchmarks.md, "On a GPU"):
#   1. pytest -m gpu: flex forward+backward against the float64 reference (fixed and learnable
#      slopes, packed + window + sinks, decoding, one BatchMask shared by two layers), bf16 runs;
#   2. H = 4, D = 64, 65,536 tokens per batch, L = 1,024 / 4,096 / 16,384, forward+backward:
#      flex + ALiBi, flex without bias, SDPA with a materialised mask, SDPA without bias (flash),
#      and what `auto` picks; TFLOP/s = 3.5 * 2 * T * L * H * D / time (causal);
#   3. the packed case (ML-1M's lengths in rows of 4,096; synthetic if the file is absent) and
#      flex with learnable slopes at L = 16,384;
#   4. D = 128 at L = 4,096 and 16,384;
#   5. with the time left: flex + ALiBi at L = 16,384, D = 64 under other forward block sizes and
#      warps than the pinned ones (rows carry their kernel_options), to re-pin from.
# Every step has its own time limit inside one overall deadline (DEADLINE_S, default 470 s);
# rows are written as they are measured, so a step cut short keeps what it had.
#
# Run from the repository root; the python is $PYTHON, else .venv/bin/python (make install), else python3
# (it needs torch, numpy and pytest). Exit status 1 when any step failed or no row was measured:
#     OUT=/tmp/gpu bash benchmarks/gpu_check.sh                # on the GPU machine
#     OUT=/tmp/gpu bash benchmarks/gpu_check.sh --device cpu   # dry run, tiny sizes, on a CPU
# Writes env.txt, pytest.txt, attention-*.txt and gpu-attention.json (all rows: keys L, mode,
# backend, ms, tflops, peak_mib, ...) under $OUT; copy gpu-attention.json to docs/results/.
#
# The training step is timed by benchmarks/gpu_training.sh (plain nn.Embedding item table: no
# torchrec or fbgemm-gpu needed there).
set -u -o pipefail
DEVICE=cuda
if [ "${1:-}" = "--device" ]; then DEVICE=${2:?--device needs cuda or cpu}; fi
OUT=${OUT:-/tmp/gpu}
mkdir -p "$OUT"
rm -f "$OUT"/attention-*.json "$OUT/gpu-attention.json" "$OUT/steps.txt"  # an earlier run's rows are not this run's
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON; elif [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
FAILED=0
START=$(date +%s)
SCALE=1  # step limits x SCALE; the CPU dry run compiles each flex case in ~15 s
if [ "$DEVICE" = cpu ]; then SCALE=4; fi
DEADLINE_S=${DEADLINE_S:-$((470 * SCALE))}

left() {  # seconds left before the deadline, at most $1
  local rest=$((DEADLINE_S - ($(date +%s) - START)))
  [ "$rest" -gt "$1" ] && rest=$1
  echo $((rest > 0 ? rest : 0))
}

step() {  # step NAME LIMIT_S COMMAND...: run under the smaller of its limit and the time left
  local name=$1 limit; limit=$(left $(($2 * SCALE))); shift 2
  if [ "$limit" -lt 20 ]; then echo "== $name: skipped, ${limit}s left" | tee -a "$OUT/steps.txt"; return; fi
  echo "== $name (limit ${limit}s)" | tee -a "$OUT/steps.txt"
  local t0; t0=$(date +%s)
  timeout "$limit" "$@" 2>&1 | tee "$OUT/$name.txt"
  local rc=${PIPESTATUS[0]}
  echo "== $name: rc=$rc in $(( $(date +%s) - t0 ))s" | tee -a "$OUT/steps.txt"
  if [ "$rc" -ne 0 ]; then FAILED=$((FAILED + 1)); fi
}

{
  if [ "$DEVICE" = cuda ]; then nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; fi
  $PY -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
    torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device")'
} 2>&1 | tee "$OUT/env.txt"

BENCH=(benchmarks/attention.py --device "$DEVICE" --repeats 5 --passes fwd+bwd)
if [ "$DEVICE" = cuda ]; then
  BENCH+=(--dtype bfloat16 --budget 65536 --heads 4)
  DENSE=(--lengths 1024 4096 16384) LONG=(--lengths 16384) WIDE=(--lengths 4096 16384) ROW=(--packed-len 4096)
else  # dry run: the same steps at tiny sizes (flex is forward-only on CPU: forward rows)
  BENCH=(benchmarks/attention.py --device cpu --repeats 1 --passes fwd --dtype float32 --budget 512 --heads 2
    --in-process)  # the code path of the CUDA run: every case in one process
  DENSE=(--lengths 256) LONG=(--lengths 256) WIDE=(--lengths 256) ROW=(--packed-len 256)
fi

step pytest 170 $PY -m pytest -m gpu -q -p no:cacheprovider \
  tests/model/test_attention.py tests/evaluation/test_eval_ranking.py
step attention-d64 170 $PY "${BENCH[@]}" "${DENSE[@]}" --dims 64 \
  --modes flex-alibi flex-nobias sdpa-mask sdpa-nobias auto --json "$OUT/attention-d64.json"
step attention-learnable 110 $PY "${BENCH[@]}" "${LONG[@]}" --dims 64 --packed "${ROW[@]}" \
  --modes flex-alibi-learnable --json "$OUT/attention-learnable.json"
step attention-packed-modes 110 $PY "${BENCH[@]}" --lengths --dims 64 --packed "${ROW[@]}" \
  --modes flex-alibi flex-nobias sdpa-mask auto --json "$OUT/attention-packed.json"
step attention-d128 110 $PY "${BENCH[@]}" "${WIDE[@]}" --dims 128 \
  --modes flex-alibi flex-nobias sdpa-nobias --json "$OUT/attention-d128.json"

SWEEP=('{"fwd_BLOCK_M": 128, "fwd_BLOCK_N": 64, "fwd_num_warps": 4, "fwd_num_stages": 3}'
       '{"fwd_BLOCK_M": 128, "fwd_BLOCK_N": 128, "fwd_num_warps": 8, "fwd_num_stages": 2}')
for i in "${!SWEEP[@]}"; do
  step "attention-sweep$i" 60 $PY "${BENCH[@]}" "${LONG[@]}" --dims 64 --modes flex-alibi \
    --kernel-options "${SWEEP[$i]}" --json "$OUT/attention-sweep$i.json"
done

$PY - "$OUT" <<'PYEOF'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
rows, formula = [], None
for name in ("attention-d64", "attention-learnable", "attention-packed", "attention-d128",
             "attention-sweep0", "attention-sweep1"):
    f = out / f"{name}.json"
    if f.exists():
        data = json.loads(f.read_text())
        rows += data["rows"]
        formula = data["formula"]
(out / "gpu-attention.json").write_text(json.dumps({"formula": formula, "rows": rows}, indent=1))
print(f"gpu-attention.json: {len(rows)} rows")
sys.exit(0 if rows else 1)
PYEOF
ROWS_RC=$?
echo "total $(( $(date +%s) - START ))s" | tee -a "$OUT/steps.txt"
if [ "$FAILED" -ne 0 ] || [ "$ROWS_RC" -ne 0 ]; then
  echo "gpu_check: $FAILED step(s) failed; rows measured: $([ "$ROWS_RC" -eq 0 ] && echo yes || echo none) (see $OUT/steps.txt)" >&2
  exit 1
fi
