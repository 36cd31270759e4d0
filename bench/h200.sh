#!/usr/bin/env bash
# The H200 figures of docs/benchmarks.md, one step per device call (see ../shared/gpu/README.md):
#   bash bench/h200.sh profile    # bench profile on both shapes (builds the 8B model once)
#   bash bench/h200.sh small      # bench run, 0.6B shape: single, concurrency 1-32, proxy
#   bash bench/h200.sh large      # bench run, 8B shape: longprompt (one server on the device at a time)
#   bash bench/h200.sh large-conc # bench run, 8B shape: concurrency 8, 16, 32
#   bash bench/h200.sh spec       # bench speculative (prompt lookup) on both shapes
#   bash bench/h200.sh ttft       # 0.6B concurrency @8, @16 with the engine's first-token
#                                 # split and its step log (where the TTFT goes)
#   bash bench/h200.sh masks      # bench masks on the 8B shape: a 16k prefill by attention path
#   bash bench/h200.sh group2     # (nvidia-h200-x2) bench group, 8B shape: 2 ranks over NCCL, one
#                                 # GPU each, vs one GPU: decode @1/8/32, cold 8k TTFT, same text
#   bash bench/h200.sh agents     # issue 33, 0.6B shape: K=1,4,8,16 agent sessions sharing a 6k
#                                 # prefix, then 32 clients' 300-token prompts at once (~5 min)
#   bash bench/h200.sh agents-8b  # the same on the 8B shape, K=4,8 and the burst (~7 min, with
#                                 # the 8B build; ~4 min when it is already built)
#   bash bench/h200.sh claude     # Claude-Code-shaped sessions, 8B shape: /v1/messages on mlxd,
#                                 # the same content via chat on both servers (~4 min, built)
#   bash bench/h200.sh blocks     # issue 33: rows extending a cached 6k prefix (8B shape, K=1,4,8,
#                                 # lengths new every repeat), prefill blocks off then on (256),
#                                 # with where the time went (~6 min, the 8B build included)
#   bash bench/h200.sh buckets    # issue 33: the same rows, attention shapes as they come, then
#                                 # padded to buckets (shape_buckets.py) (~6 min, 8B built)
#   bash bench/h200.sh first-token # issue 33: the same rows (shape buckets on), first tokens from
#                                 # a decode forward, then from the prefill forward (~5 min)
#   bash bench/h200.sh first-token-small # the same on the 0.6B shape (~2 min)
#   bash bench/h200.sh host-reads # issue 33: the same rows (8 tokens each), their histories
#                                 # written behind to an SSD tier first, the writer reading
#                                 # device-made copies, then the entries in place (~4 min, the
#                                 # 8B build included)
#   bash bench/h200.sh restore    # issue 34: gemma3-12b's SSD restore phase by phase, with the
#                                 # engine's first step on it; bench.cuda_memory (~3 min)
#   bash bench/h200.sh families  # issue 34: gemma3-12b (sliding window) then nemotron-h-8b
#                                 # (hybrid), random bf16 weights: multi-turn with an unload and
#                                 # reload, single, 8 clients; mlxd vs mlx_lm.server (~8 min)
#   bash bench/h200.sh adapters   # issue 36: 32 clients over 1, 4, 16 LoRA adapters on one mlxd
#                                 # vs all on the base (goal >= 0.8x at 16), mlx_lm.server at 0
#                                 # and 1 adapter; 8B shape then 0.6B (~7 min, 8B build included)
#   bash bench/h200.sh vision     # issue 35: gemma3-4b VLM (random bf16, SigLIP 896 px): image TTFT
#                                 # cold and second turn, 8 clients (4 image, 4 text) at once;
#                                 # mlxd vs mlx-vlm's generate (~4 min, the 8.6 GB build included)
# Results go to $OUT (the device tool brings them back).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-/tmp/out}
mkdir -p "$out"
export PYTHONPATH="$root/src:${PYTHONPATH:-}:$root"
cd "$root"
case "${1:-}" in
profile)
  timeout 270 python3 -m bench profile --shape qwen3-0.6b --batches 1,8,32 2>&1 | tee "$out/profile-0.6b.md"
  timeout 290 python3 -m bench profile --shape qwen3-8b --batches 1,8,32 --repeats 2 2>&1 | tee "$out/profile-8b.md"
  ;;
spec)
  timeout 200 python3 -m bench speculative --shape qwen3-0.6b --tokens 256 2>&1 | tee "$out/spec-0.6b.md"
  timeout 250 python3 -m bench speculative --shape qwen3-8b --tokens 256 2>&1 | tee "$out/spec-8b.md"
  ;;
small)
  timeout 560 bash bench/gpu_run.sh --shape qwen3-0.6b --only single,concurrency,proxy \
    --levels 1,8,16,32 --repeats 3 --out "$out/small" 2>&1 | tail -60
  ;;
large)
  MLXD_STEP_LOG="$out/steps-8b.jsonl" timeout 560 bash bench/gpu_run.sh --shape qwen3-8b \
    --only longprompt --repeats 3 --exclusive --out "$out/large" 2>&1 | grep '^|'
  python3 -m bench steps "$out/steps-8b.jsonl" --slowest 15 | tee "$out/steps-8b.md"
  ;;
large-conc)
  MLXD_STEP_LOG="$out/steps-8b.jsonl" timeout 560 bash bench/gpu_run.sh --shape qwen3-8b \
    --only concurrency --levels 8,16,32 --repeats 3 --out "$out/large-conc" 2>&1 | grep '^|'
  python3 -m bench steps "$out/steps-8b.jsonl" --slowest 15 | tee "$out/steps-8b.md"
  ;;
ttft)
  MLXD_STEP_LOG="$out/steps.jsonl" timeout 330 bash bench/gpu_run.sh --shape qwen3-0.6b \
    --only concurrency --levels 8,16 --repeats 3 --out "$out/ttft" 2>&1 | grep '^|'
  python3 -m bench steps "$out/steps.jsonl" --slowest 25 | tee "$out/steps.md"
  ;;
masks)
  timeout 280 python3 -m bench masks --shape qwen3-8b 2>&1 | grep -v tokenizer | tee "$out/masks-8b.md"
  ;;
group2)
  # NVLink multicast stays off (the lent machines' rule; NCCL reads this at init).
  NCCL_NVLS_ENABLE=0 timeout 560 bash bench/gpu_run.sh group --shape qwen3-8b --backend nccl \
    --ranks 2 --tokens 256 --levels 1,8,32 --ttft-tokens 8192 --out "$out/group2-8b.md" 2>&1 | tail -20
  ;;
agents)
  timeout 560 bash bench/gpu_run.sh agents --shape qwen3-0.6b --levels 1,4,8,16 --prefix 6000 --exclusive \
    --out "$out/agents-0.6b" 2>&1 | grep -v tokenizer | tail -50
  ;;
agents-8b)
  MLXD_STEP_LOG="$out/steps-agents-8b.jsonl" timeout 570 bash bench/gpu_run.sh agents \
    --shape qwen3-8b --levels 4,8 --prefix 6000 --exclusive --out "$out/agents-8b" 2>&1 \
    | grep -v tokenizer | tail -30
  ;;
claude)
  timeout 500 bash bench/gpu_run.sh claude --shape qwen3-8b --instructions 6000 --exclusive \
    --out "$out/claude-8b" 2>&1 | grep -v tokenizer | tail -25
  ;;
blocks)
  for b in 0 256; do
    timeout 270 python3 -m bench extend --shape qwen3-8b --prefix 6000 --history 300 --new 270 \
      --rows 1,4,8 --repeats 3 --phases --block $b 2>&1 | grep -v tokenizer | tee "$out/extend-8b-block$b.md"
  done
  ;;
buckets)
  # Issue 33: rows extending a cached 6k prefix (8B shape, K=1,4,8, lengths new every repeat),
  # attention shapes as they come, then padded to buckets (worker/model/shape_buckets.py).
  for b in "" --buckets; do
    timeout 270 python3 -m bench extend --shape qwen3-8b --prefix 6000 --history 300 --new 270 \
      --rows 1,4,8 --repeats 4 --phases $b 2>&1 | grep -v tokenizer | tee "$out/extend-8b$b.md"
  done
  ;;
first-token)
  # Issue 33: the same rows with shape buckets on (the worker's CUDA default), first tokens
  # from a decode forward of the last prompt token (mlx-lm's order), then from the prefill
  # forward (worker/model/head.py) (~5 min, the 8B build included).
  for f in --mlx-lm-first-token ""; do
    timeout 270 python3 -m bench extend --shape qwen3-8b --prefix 6000 --history 300 --new 270 \
      --rows 1,4,8 --repeats 3 --buckets $f 2>&1 | grep -v tokenizer | tee "$out/extend-8b$f.md"
  done
  ;;
first-token-small)
  # The same on the 0.6B shape (~2 min: its build is seconds).
  for f in --mlx-lm-first-token ""; do
    timeout 200 python3 -m bench extend --shape qwen3-0.6b --prefix 6000 --history 300 --new 270 \
      --rows 1,4,8 --repeats 3 --buckets $f 2>&1 | grep -v tokenizer | tee "$out/extend-0.6b$f.md"
  done
  ;;
host-reads)
  # Issue 33: rows extending histories the SSD tier wrote behind. 2026-12-07 (H100): K = 1
  # 0.275 s against 0.048 s with no SSD tier: the writer's CPU read of an entry moved its
  # buffer into managed memory and its pages to the host, and the extension faulted them back.
  # The writer now reads device-made copies on CUDA (kv_arrays.device_copies); A/B with
  # the old read in place (~4 min, the 8B build included). A run cut short by
  # its timeout leaves its SSD folder: removed before each.
  for f in "--ssd" "--ssd --ssd-in-place"; do
    rm -rf "${TMPDIR:-/tmp}"/extend-ssd-*
    timeout 150 python3 -m bench extend --shape qwen3-8b --prefix 6000 --history 300 --new 270 \
      --rows 1,4 --repeats 3 --buckets $f 2>&1 | grep -v tokenizer | tee -a "$out/host-reads.md"
  done
  rm -rf "${TMPDIR:-/tmp}"/extend-ssd-*
  ;;
window-prefill)
  # Where gemma3-12b's cold 16k prompt goes (2026-12-07, H100: 3-4k tok/s on both servers, the
  # 8B 24k): chunk sizes, the first-token fold, attention by mask kind (~3 min, build included).
  timeout 280 python3 -m bench.window_prefill --shape gemma3-12b --tokens 16404 2>&1 \
    | grep -v tokenizer | tee "$out/window-prefill-gemma3-12b.md"
  ;;
restore)
  # Issue 34: where gemma3-12b's 1.4 GB SSD restore goes on the GPU host (no model, no HTTP):
  # read into one NumPy buffer then copied into MLX, against today's read into an MLX array
  # per tensor, each with the engine's first step on the restored KV; 3 fresh processes each,
  # from the page cache (~2 min). Then how bytes reach GPU memory, way by way (~30 s).
  timeout 200 python3 -m bench.restore --layers 48 --runs 3 2>&1 | tee "$out/restore-48.md"
  timeout 100 python3 -m bench.cuda_memory 2>&1 | tee "$out/cuda-memory.md"
  ;;
families)
  # Estimated on an H200 (the 8B shape's figures above; not yet run): gemma3-12b ~4.5 min =
  # build 22 GiB ~30 s, both servers loaded and warm ~40 s, multi-turn x2 ~2.5 min (per run
  # four 16k prefills at ~5-10 s, mlxd's unload ~10 s and load ~15 s), single ~15 s, 8 clients
  # ~20 s; nemotron-h-8b ~3 min (15 GiB, 16k prefills ~4 s, a small drain). Each shape's
  # report is rewritten after every part, so a timeout keeps the parts done. The 12B's files
  # go before the 8B's are written: 22 + 15 GiB and a prompt cache tier on a 64 GiB disk.
  # The 12B with --exclusive (2026-12-07, H100: beside mlx_lm.server's model and buffers
  # mlxd's figures doubled and both ran out of memory): the multi-turn part only (~5 min).
  # The engine's step log and the worker logs come back flat (the device tool drops folders
  # deeper than $OUT/x/y): where a reload's resend spent its time (2026-12-07 05:40).
  MLXD_STEP_LOG="$out/steps-gemma3-12b.jsonl" timeout -k 20 330 bash bench/gpu_run.sh \
    families --shape gemma3-12b --exclusive --only multiturn --out "$out/families-gemma3-12b" \
    2>&1 | grep -v tokenizer | tail -40
  find "$out/families-gemma3-12b/logs" -name "*.log" | while read -r f; do
    cp "$f" "$out/gemma3-12b-$(basename "$(dirname "$f")")-$(basename "$f")"
  done
  rm -rf "$HOME/.cache/mlxd-bench/models/gemma3-12b"
  timeout -k 20 230 bash bench/gpu_run.sh families --shape nemotron-h-8b \
    --out "$out/families-nemotron-h-8b" 2>&1 | grep -v tokenizer | tail -40
  ;;
adapters)
  # Ran on an H100 (2026-12-06): the 8B step took 181 s, but with both servers loaded side by
  # side its runs 2-3 ran out of memory on 80 GB; there, add --mlx-lm-levels '' (mlxd alone,
  # 109 s for 3 runs). On the H200 (141 GB) both fit. The report is rewritten after every
  # run, so a timeout keeps the runs done. Then the 0.6B shape (~2 min).
  timeout -k 20 400 bash bench/gpu_run.sh adapters --shape qwen3-8b \
    --out "$out/adapters-8b" 2>&1 | grep -v tokenizer | tail -40
  timeout -k 20 150 bash bench/gpu_run.sh adapters --shape qwen3-0.6b \
    --out "$out/adapters-0.6b" 2>&1 | grep -v tokenizer | tail -40
  ;;
vision)
  # Estimated, not yet run: build 8.6 GB ~40-60 s (drawn on the GPU, 2 GiB shards), mlxd and
  # the mlx-vlm process load side by side ~30 s, warm-up ~10 s; per run two 1024² turns on
  # each side (~0.2-0.5 s each) and the mix: mlxd's 8 rows batched (~2 s), mlx-vlm's one after
  # another (8 x 64 tok, ~8 s): 3 runs ~40 s. The report is rewritten after every run, so the
  # timeout keeps the runs done. Needs mlx-vlm in /tmp/site (.gpu carries its wheel).
  timeout -k 20 290 bash bench/gpu_run.sh vision --shape gemma3-4b \
    --out "$out/vision-gemma3-4b" 2>&1 | grep -v tokenizer | tail -40
  ;;
*) echo "usage: $0 profile|small|large|large-conc|spec|ttft|masks|group2|agents|agents-8b|claude|blocks|buckets|first-token|first-token-small|window-prefill|restore|families|adapters|vision" >&2; exit 2 ;;
esac
