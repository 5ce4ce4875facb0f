#!/usr/bin/env bash
# The checks that need a GPU, as one script for a session that is lent one (not part of CI).
#
#   OUT=gpu_results scripts/gpu_checks.sh            # on the GPU machine, in the repository root
#
# 1. the environment (GPU, torch, CUDA, transformers) -> $OUT/env.txt
# 2. the `gpu`-marked tests: fp16 + GradScaler through predict phases; FSDP2 and DeepSpeed
#    need two GPUs and skip on one (they say so) -> $OUT/gpu_tests.log
# 3. the idle cost of the default on GPT-2's 124M configuration, wall-clock (issue 13): three alternating
#    plain/hybrid pairs and the engine's memory -> $OUT/overhead_gpt2_124m/
# 4. the verdict table's arena on CUDA (issue 21), seed 0, wall-clock: GPT-2's 124M configuration from
#    scratch and the pretrained decoder's full and LoRA fine-tunes (the decoder is pretrained first, a
#    minute on the GPU) -> $OUT/arena/<task>/ (results.json, report.md, arena.png)
#
# The machine must already have this project's dependencies (transformers in the pinned range, datasets,
# peft, accelerate); it has no network, so bring wheels that are missing (under the 64 MiB carry limit:
# the MiniLM weights are not needed here). Each step writes its log even when a later one fails.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-gpu_results}"
mkdir -p "$OUT"
status=0

{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda,
    'available', torch.cuda.is_available()); print('transformers', transformers.__version__)"
} > "$OUT/env.txt" 2>&1 || status=1
cat "$OUT/env.txt"

python -m pytest -m gpu -q -p no:cacheprovider -rs > "$OUT/gpu_tests.log" 2>&1 || status=1
tail -15 "$OUT/gpu_tests.log"

hf-hybrid bench --overhead --suite full --tasks clm_gpt2_124m --pairs 3 \
  --out "$OUT/overhead_gpt2_124m" > "$OUT/overhead.log" 2>&1 || status=1
tail -8 "$OUT/overhead.log"

METHODS="plain hybrid hybrid-predict null freeze:6 selective-backprop dropbp:p=0.25 dropbp:p=0.5"
hf-hybrid bench --suite quick --tasks clm_gpt2_124m --seeds 0 --methods $METHODS \
  --out "$OUT/arena" > "$OUT/arena_gpt2.log" 2>&1 || status=1
tail -14 "$OUT/arena_gpt2.log"
hf-hybrid bench --suite full --tasks decoder_ft decoder_lora --seeds 0 \
  --methods plain hybrid hybrid-predict null freeze:1 freeze:3 selective-backprop dropbp:p=0.5 \
  --out "$OUT/arena" > "$OUT/arena_decoder.log" 2>&1 || status=1
tail -24 "$OUT/arena_decoder.log"
exit $status
