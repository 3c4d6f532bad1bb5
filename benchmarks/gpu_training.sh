#!/usr/bin/env bash
# The GPU training check (issue 20): the CUDA training-step test (no host synchronisation in the
# bf16 step, flex and sdpa), then benchmarks/training.py --device cuda (tokens/s, seconds per ML-1M
# epoch, peak memory for max_len 200 / 2,048 / 8,192, flex vs sdpa), then, where polars can be
# imported, the 30-epoch ML-1M recipe to its test metrics (benchmarks/gpu_fit.py). Nothing here
# needs torchrec, fbgemm-gpu or MLflow: the item table is the plain nn.Embedding.
#
# Prepare on this machine (both paths are ignored by git and travel with `carry`):
#     recsys-alibi prepare --input ../shared/data/ml-1m/ml-1m.txt.gz --format sasrec \
#         --output runs/ml1m/prepared --set data.min_events_per_user=1 --set data.min_events_per_item=1
#     rm runs/ml1m/prepared/events.parquet            # only sequences.parquet and items.parquet travel
#     pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
#         -d runs/gpu-wheels/base pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 \
#         typing-inspection==0.4.5 typing_extensions==4.16.0
#     pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
#         -d runs/gpu-wheels/polars polars==2.1.0 polars-runtime-32==2.1.0   # 55 MB: a separate call
#
# Run from the repository root (STAGE=bench: test + benchmark, ~5 min; STAGE=fit: the 30 epochs,
# at most FIT_MINUTES of training; STAGE=all: both, for a machine without a 10-minute limit):
#     OUT=/tmp/gpu STAGE=bench bash benchmarks/gpu_training.sh       # carry runs/ml1m/prepared runs/gpu-wheels/base
#     OUT=/tmp/gpu STAGE=fit bash benchmarks/gpu_training.sh         # carry ... runs/gpu-wheels/polars too
# Writes under $OUT: env.txt, pytest.txt, training.txt, gpu-training.json (-> docs/results/),
# fit.txt, gpu-fit.json. Dry run on a CPU: DEVICE=cpu BENCH_ARGS="--lengths 200 2048 --steps 1
# --warmup 1 --tokens-per-step 4096" FIT_ARGS="--set train.max_epochs=1 --set train.limit_train_batches=2"
set -u -o pipefail
OUT=${OUT:-/tmp/gpu}
STAGE=${STAGE:-bench}
DEVICE=${DEVICE:-cuda}
PREPARED=${PREPARED:-runs/ml1m/prepared}
WHEELS=${WHEELS:-runs/gpu-wheels}
VENDOR=${VENDOR:-/tmp/recsys-alibi-vendor}
FIT_MINUTES=${FIT_MINUTES:-6}
PY=${PYTHON:-python3}
mkdir -p "$OUT" "$VENDOR"

# carried wheels (pure Python, or built for this Python) unpacked beside the code, never installed
for wheel in "$WHEELS"/*/*.whl; do
  [ -e "$wheel" ] && $PY -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$wheel" "$VENDOR"
done
export PYTHONPATH=$PWD:$VENDOR${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1

{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
  $PY -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available() and torch.cuda.get_device_name())'
  for mod in lightning pydantic pyarrow polars torchrec mlflow; do
    $PY -c "import $mod; print('$mod', getattr($mod, '__version__', '?'))" 2>/dev/null || echo "$mod: not importable"
  done
} 2>&1 | tee "$OUT/env.txt"

if [ "$STAGE" = bench ] || [ "$STAGE" = all ]; then
  timeout 150 $PY -m pytest -m gpu -q -p no:cacheprovider tests/training/test_no_host_sync.py 2>&1 | tee "$OUT/pytest.txt"
  timeout 330 $PY -m benchmarks.training --device "$DEVICE" --prepared "$PREPARED" ${BENCH_ARGS:-} \
    --json "$OUT/gpu-training.json" 2>&1 | tee "$OUT/training.txt"
fi

if [ "$STAGE" = fit ] || [ "$STAGE" = all ]; then
  if $PY -c 'import polars' 2>/dev/null; then
    timeout $(( FIT_MINUTES * 60 + 150 )) $PY -m benchmarks.gpu_fit --config configs/movielens-1m.yaml \
      --prepared "$PREPARED" --output "$VENDOR/fit" --json "$OUT/gpu-fit.json" \
      --set train.max_minutes="$FIT_MINUTES" --set train.accelerator=auto --set train.num_workers=4 \
      ${FIT_ARGS:-} 2>&1 | tail -40 | tee "$OUT/fit.txt"
  else
    echo "polars cannot be imported: carry $WHEELS/polars for the 30-epoch fit" | tee "$OUT/fit.txt"
  fi
fi
