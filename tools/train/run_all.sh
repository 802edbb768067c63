#!/usr/bin/env bash
# Train the small Laguna target and its DFlash drafter, write the parity traces, and pack everything.
#
# Runs on the GPU machine (no network, no cargo; python3 with torch, transformers >= 5.17 (Laguna), tokenizers,
# safetensors, numpy) from inputs prepared on a CPU machine by corpus.py and tokenizer.py:
#   .cache/train-in/corpus-train.jsonl.gz  .cache/train-in/corpus-heldout.jsonl.gz  .cache/train-in/tokenizer.json
# Output: $OUT/laguna-small.tar.gz (target/ drafter/ traces.json metrics.json ...) and $OUT/metrics.json;
# $OUT defaults to .cache/train-out. Everything is seeded; the training lengths are calibrated to the time
# budgets below unless TARGET_ARGS / DRAFTER_ARGS pass --steps N (the metrics record the steps used).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT_DIR=${OUT:-$PWD/.cache/train-out}
WORK=${WORK:-/tmp/fastdecode-train}
TARGET_BUDGET=${TARGET_BUDGET:-170}
DRAFTER_BUDGET=${DRAFTER_BUDGET:-110}
# STAGES: a subset of "target drafter traces"; without "target", $WORK must already hold target/ (and, for the
# final metrics, target-metrics.json and traces.json) from an earlier run.
STAGES=${STAGES:-"target drafter traces"}
has() { [[ " $STAGES " == *" $1 "* ]]; }
export PYTHONUNBUFFERED=1 PYTHONHASHSEED=0
if has target; then rm -rf "$WORK"; fi
mkdir -p "$WORK" "$OUT_DIR"
T0=$(date +%s)
# after each stage, pack what exists so far (a run cut short still returns its finished stages)
pack() { (cd "$WORK" && tar -czf "$OUT_DIR/laguna-small.tar.gz" $(ls -d target drafter traces.json ./*metrics.json 2>/dev/null)); }

python3 - <<'EOF'
import torch, transformers, tokenizers, safetensors, numpy, platform
print("python", platform.python_version(), "torch", torch.__version__, "transformers", transformers.__version__,
      "tokenizers", tokenizers.__version__, "safetensors", safetensors.__version__, "numpy", numpy.__version__)
print("cuda", torch.cuda.is_available(), torch.cuda.get_device_name() if torch.cuda.is_available() else "")
EOF
for f in corpus-train.jsonl.gz corpus-heldout.jsonl.gz tokenizer.json; do
  test -f ".cache/train-in/$f" || { echo "missing .cache/train-in/$f (run corpus.py and tokenizer.py)"; exit 1; }
done
sha256sum .cache/train-in/*

echo "== unit tests"
python3 tools/train/test_nvfp4.py
python3 tools/train/test_dflash.py

if has target; then
  echo "== target"
  # shellcheck disable=SC2086
  python3 tools/train/train_target.py --out "$WORK/target" --metrics "$WORK/target-metrics.json" \
    --time-budget "$TARGET_BUDGET" ${TARGET_ARGS:-}
  pack
fi

if has drafter; then
  echo "== drafter"
  # shellcheck disable=SC2086
  python3 tools/train/train_drafter.py --target "$WORK/target" --out "$WORK/drafter" \
    --metrics "$WORK/drafter-metrics.json" --time-budget "$DRAFTER_BUDGET" ${DRAFTER_ARGS:-}
  pack
fi

if has traces; then
  echo "== traces"
  # shellcheck disable=SC2086
  python3 tools/train/traces.py --target "$WORK/target" --out "$WORK/traces.json" ${TRACE_ARGS:-}
fi

python3 - "$WORK" "$T0" <<'EOF'
import json, sys, time
from pathlib import Path
w = Path(sys.argv[1])
t = json.loads((w / "target-metrics.json").read_text())
d = json.loads((w / "drafter-metrics.json").read_text())
tr = json.loads((w / "traces.json").read_text())
m = {
    "heldout_loss": t["heldout_loss"], "heldout_perplexity": t["heldout_perplexity"],
    "heldout_tokens": t["heldout_tokens"], "target_steps": t["steps"], "target_best_step": t["best_step"],
    "target_stop_reason": t["stop_reason"], "target_train_seconds": t["train_seconds"],
    "target_train_tokens_seen": t["train_tokens_seen"], "target_params": t["params"],
    "target_safetensors_bytes": t["model_safetensors_bytes"], "target_sha256": t["model_safetensors_sha256"],
    "drafter_heldout_loss": d["drafter_heldout_loss_weighted_ce"],
    "drafter_heldout_row_accuracy_teacher_forced": d["drafter_heldout_row_accuracy_teacher_forced"],
    "drafter_steps": d["drafter_steps"], "drafter_stop_reason": d["drafter_stop_reason"],
    "drafter_train_seconds": d["drafter_train_seconds"], "drafter_params": d["drafter_params"],
    "drafter_safetensors_bytes": d["drafter_safetensors_bytes"], "drafter_sha256": d["drafter_safetensors_sha256"],
    "traces_prompts": len(tr["prompts"]), "traces_new_tokens": tr["new_tokens"],
    "traces_min_top2_gap": tr["min_top2_gap"], "traces_model_sha256": tr["model_sha256"],
    "total_seconds": time.time() - int(sys.argv[2]),
    "device": t["device"], "torch": t["torch"], "transformers": t["transformers"],
}
assert m["traces_model_sha256"] == m["target_sha256"]
(w / "metrics.json").write_text(json.dumps(m, indent=1) + "\n")
print(json.dumps(m, indent=1))
EOF

pack
cp "$WORK/metrics.json" "$OUT_DIR/metrics.json"
ls -la "$OUT_DIR" "$WORK/target" "$WORK/drafter"
echo "done in $(( $(date +%s) - T0 ))s"
