#!/bin/bash
# One device call for the tensor-core family (issue 17), on a 1-GPU NVIDIA host, from the repo root
# with .whl/ and .bench/ carried (see tools/gpu-setup.sh and tools/gpu-bench-session.sh):
#   run(command="bash tools/gpu-mma-session.sh PHASES", carry=[".whl", ".bench"])
# PHASES, comma-separated, each bounded by its own timeout:
#   test    tests/test_gemm_mma.py with the real instruction
#   gemm    tools/check_mma.py: 4096^3 GEMM, every config, f16 and tf32
#   tune16  yolo-cl tune yolov3 fp16 (TUNE_S seconds, default 120); tune32 the same at tf32;
#           tunev4 yolov4 fp16 (the shapes yolov3's entries do not cover)
#   bench   yolo-cl bench (per-layer device time) of $BENCH (default "yolov3:fp16 yolov3:tf32
#           yolov4:fp16 yolov3:fp32")
#   torch   the PyTorch + cuDNN peer (.bench/torch_darknet.py) on yolov3 and yolov4, same call
#   gather  (under 4 minutes) test_gemm_mma.py's implicit, gather and split-K tests with the real
#           instruction, then tools/mma_gather_ab.py: yolov3 416 fp16 device time per 3x3 conv with the
#           tuned configs and with each implicit gather forced (YOLO_CL_MMA_GATHER=0..3, ST >= 2), in
#           one process, $GATHER_SETTINGS (default tuned,0,1,2,3); output in $OUT/gather.txt
#   retime  (under 8 minutes) a batched size, default yolov3 608 batch 8 fp16 ($RT_MODEL $RT_SIZE
#           $RT_BATCH $RT_PREC): yolo-cl bench before, tools/retime.py --untuned over $RT_VARIANTS (large
#           tiles by default) into the user database (RT_RESUME=FILE: starting from FILE's entries), yolo-cl bench after, the PyTorch peer at the same
#           size and batch, and tools/bench_host.py's wall / device; outputs in $OUT/retime-*.txt
# SPLIT_SUM=kernel runs the phases with the in-kernel split-K sum (YOLO_CL_MMA_SPLIT_SUM=kernel),
# unless its tests fail first. The user tuning database the tune phases write ($YOLO_CL_CACHE/tuning.yaml) is copied to $OUT;
# RESUME=FILE (a carried earlier one, e.g. .bench/tuning-h100.yaml) starts from it: its shapes are kept, the rest tuned.
set -u
PHASES=",${1:-test,gemm},"
TUNE_S=${TUNE_S:-120}         # tune budget in seconds (TUNE32_S for tf32, default the same)
. tools/gpu-setup.sh > /tmp/setup.log 2>&1 || { cat /tmp/setup.log; exit 1; }
export YOLO_CL_CACHE=/tmp/yc
mkdir -p /tmp/w "$YOLO_CL_CACHE"
[ -n "${RESUME:-}" ] && [ -f "$RESUME" ] && cp "$RESUME" "$YOLO_CL_CACHE/tuning.yaml"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
has() { [[ "$PHASES" == *",$1,"* ]]; }
if has test; then
  echo "== test ($(date +%T))"
  timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_gemm_mma.py 2>&1 | tail -n 8
fi
if [ "${SPLIT_SUM:-}" = kernel ]; then
  if timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_gemm_mma.py -k split_k > /tmp/sk.txt 2>&1; then
    export YOLO_CL_MMA_SPLIT_SUM=kernel
  else
    echo "in-kernel split-K sum failed its tests: this call adds the splits in a second launch"
  fi
fi
if has gemm; then
  echo "== gemm ($(date +%T))"
  timeout 120 python3 tools/check_mma.py --sizes 4096 --reps 10 > "$OUT/gemm.txt" 2>&1
  grep -v "^$" "$OUT/gemm.txt" | sort -t: -k2 | head -n 40
fi
tune() {   # MODEL PRECISION
  echo "== tune $1 $2 ($(date +%T))"
  local s=$TUNE_S
  [ "$2" = tf32 ] && s=${TUNE32_S:-$TUNE_S}
  timeout $((s + 40)) python3 -m yolo_cl tune "$1" --size 416 --precision "$2" --budget "$s" \
    > "$OUT/tune-$1-$2.txt" 2>&1
  tail -n 3 "$OUT/tune-$1-$2.txt"
  cp "$YOLO_CL_CACHE/tuning.yaml" "$OUT/tuning.yaml" 2>/dev/null
}
has tune16 && tune yolov3 fp16
has tune32 && tune yolov3 tf32
has tunev4 && tune yolov4 fp16
if has torch; then
  echo "== torch ($(date +%T))"
  for m in yolov3 yolov4; do python3 .bench/make_weights.py models/cfg/$m.cfg /tmp/w/$m.weights > /dev/null; done
  timeout 120 python3 .bench/torch_darknet.py bench "$OUT/torch.json" \
    v3:models/cfg/yolov3.cfg:/tmp/w/yolov3.weights:416:1 v4:models/cfg/yolov4.cfg:/tmp/w/yolov4.weights:416:1 \
    > "$OUT/torch.log" 2>&1
  tail -n 12 "$OUT/torch.log"
fi
if has bench; then
  echo "== bench ($(date +%T))"
  bench() {   # MODEL PRECISION
    timeout 60 python3 -m yolo_cl bench "$1" --size 416 --precision "$2" --repeat 20 --peak 63600 2>&1 \
      | sed "s/^/[$1 $2] /"
  }
  for mp in ${BENCH:-yolov3:fp16 yolov3:tf32 yolov4:fp16 yolov3:fp32}; do bench "${mp%%:*}" "${mp##*:}"; done \
    > "$OUT/bench.txt"
  grep -h "device time\|total\|wall" "$OUT/bench.txt" | head -n 24
fi
if has gather; then
  echo "== gather ($(date +%T))"
  timeout 50 python3 -m pytest -q -p no:cacheprovider tests/test_gemm_mma.py -k "implicit or gather or split" \
    2>&1 | tail -n 4
  timeout 170 python3 tools/mma_gather_ab.py yolov3 --size 416 --precision fp16 --repeat 20 \
    --settings "${GATHER_SETTINGS:-tuned,0,1,2,3}" > "$OUT/gather.txt" 2>&1
  tail -n 60 "$OUT/gather.txt"
fi
if has retime; then
  m=${RT_MODEL:-yolov3} sz=${RT_SIZE:-608} bt=${RT_BATCH:-8} pr=${RT_PREC:-fp16}
  v=${RT_VARIANTS:-set:MWG=128/NWG=128/KWG=32/WM=2/WN=4/ST=2,set:MWG=128/NWG=128/KWG=32/WM=2/WN=4/ST=2/GA=1,set:MWG=128/NWG=64/KWG=32/WM=2/WN=2/ST=2/GA=1,set:MWG=64/NWG=128/KWG=32/WM=2/WN=2/ST=2/GA=1,set:MWG=128/NWG=128/KWG=16/WM=2/WN=2/ST=3/GA=1,set:MWG=256/NWG=128/KWG=16/WM=4/WN=2/ST=2/GA=1}
  rbench() {   # TAG
    timeout 90 python3 -m yolo_cl bench "$m" --size "$sz" --batch "$bt" --precision "$pr" --repeat 10 --peak 63600 \
      > "$OUT/retime-bench-$1.txt" 2>&1
    grep -h "device time\|end to end\|launches per" "$OUT/retime-bench-$1.txt"
  }
  echo "== retime: bench before ($(date +%T))"; rbench before
  [ -n "${RT_RESUME:-}" ] && cp "$RT_RESUME" "$YOLO_CL_CACHE/tuning.yaml"     # earlier entries, kept unless beaten
  echo "== retime ($(date +%T))"
  timeout 360 python3 tools/retime.py "$m" --size "$sz" --batch "$bt" --precision "$pr" --untuned --reps 5 --budget "${RT_BUDGET:-270}" --margin "${RT_MARGIN:-0.03}" \
    --variants "$v" > "$OUT/retime.txt" 2>&1
  tail -n 30 "$OUT/retime.txt"
  cp "$YOLO_CL_CACHE/tuning.yaml" "$OUT/tuning.yaml" 2>/dev/null
  echo "== retime: bench after ($(date +%T))"; rbench after
  echo "== retime: torch ($(date +%T))"
  python3 .bench/make_weights.py models/cfg/$m.cfg /tmp/w/$m.weights > /dev/null
  timeout 120 python3 .bench/torch_darknet.py bench "$OUT/retime-torch.json" "x:models/cfg/$m.cfg:/tmp/w/$m.weights:$sz:$bt" \
    > "$OUT/retime-torch.log" 2>&1
  tail -n 6 "$OUT/retime-torch.log"
  echo "== retime: host ($(date +%T))"
  timeout 90 python3 tools/bench_host.py --models "$m:$sz:$bt" --precision "$pr" --reps 20 --video "" > "$OUT/retime-host.txt" 2>&1
  tail -n 12 "$OUT/retime-host.txt"
fi
echo "== done ($(date +%T))"
