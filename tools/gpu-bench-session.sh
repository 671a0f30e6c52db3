#!/bin/bash
# One device call that measures what BENCHMARKS.md reports for the GPU issues, on a 1- or 2-GPU
# NVIDIA host (run from the repo root, with .whl/ and .bench/ carried; see tools/gpu-setup.sh):
#   .bench/ holds torch_darknet.py and make_weights.py (the PyTorch peer, from ../shared/gpu) and
#   library1.mp4 (the portrait clip, from ../shared/videos).
#   run(command="bash tools/gpu-bench-session.sh [PHASES]", carry=[".whl", ".bench"])
# PHASES (comma-separated, default all; each bounded by its own timeout so one slow phase cannot
# starve the rest):
#   torch  the PyTorch + cuDNN peer on the same cfgs (fp32 IEEE / TF32 / fp16, CUDA graphs), alone;
#   bench  yolo-cl bench (device time per layer, launches) for yolov3 fp32/fp16/tf32, yolov4 fp16 and
#          yolov3 608 batch 8 fp16 on GPU 0;
#   host   tools/bench_host.py (run/forward/detect wall, launches, video rates), fp32 and fp16;
#   build  a first detect of yolov3 (fp32, empty kernel caches, NVIDIA's compute cache included),
#          its layers bound on 1 and on 8 threads (tools/bench_first_run.py); --thresh 1 keeps the
#          random weights' thousands of 100% boxes out of NMS (seconds of host work, not compiling);
#   serve  tools/bench_serve.py: detect_batch against serve --workers 1,2,4,8 at batch 8, then
#          4 streams; on every device where there are two (issue 23).
#   scale  one GPU against every GPU, same load per device (issue 20's two-device target): serve
#          --workers 4 per device (96 clients per device) for yolov3 416 fp16 (random weights,
#          --thresh 1: device-bound), yolov3-tiny 416 (real weights, 8 workers per device) on every
#          GPU, and 8 file streams through one process per device; YOLO_CL_WAIT as set (default:
#          the servers' own), SCALE_NO_STREAMS=1 leaves the streams out;
#   split  yolov3 416 fp16 with split-K sums in a second launch (the default) and inside
#          the GEMM launch (YOLO_CL_MMA_SPLIT_SUM=kernel), alternating (issue 17);
#   wait   yolov3 416 fp16 served with 4 workers per GPU on every GPU with each YOLO_CL_WAIT mode
#          (engine/waiting.py: driver, sleep, callback; WAIT_MODES narrows them), and detect_batch's
#          CPU per image each way;
#   stress tools/stress_device_path.py: yolov3-tiny 416 through a Fleet from many threads, 1 and 8
#          processes on GPU 0 (and 8 on each GPU at once where there are two), every answer checked;
#   streams 8 file streams on GPU 0 in one process against one stream's device-bound rate, 3 rounds
#          of the clip played 6 times (issue 20's N-streams target);
#   profile 8 file streams in one process under py-spy (its wheel carried in .whl/): the threads'
#          busiest frames;
#   tests  the GPU-path tests (launches, device pre/post-processing and NMS, frames in flight,
#          staging, Fleet) with ../shared's images and clip made from .bench/.
# HOST_MODELS and HOST_VIDEO (default: the clip played 6 times) narrow the host phase.
set -u
PHASES=",${1:-torch,bench,host,serve},"
has() { [[ "$PHASES" == *",$1,"* ]]; }
. tools/gpu-setup.sh > /tmp/setup.log 2>&1 || { cat /tmp/setup.log; exit 1; }
NGPU=$(nvidia-smi -L | wc -l)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p /tmp/w
for m in yolov3 yolov4; do python3 .bench/make_weights.py models/cfg/$m.cfg /tmp/w/$m.weights > /dev/null; done
if has torch; then
  echo "== torch ($(date +%T))"
  timeout 150 python3 .bench/torch_darknet.py bench "$OUT/torch.json" \
    tiny:models/yolov3-tiny.cfg:models/yolov3-tiny.weights:416:1 \
    v3:models/cfg/yolov3.cfg:/tmp/w/yolov3.weights:416:1 v4:models/cfg/yolov4.cfg:/tmp/w/yolov4.weights:416:1 \
    v3b8:models/cfg/yolov3.cfg:/tmp/w/yolov3.weights:608:8 > "$OUT/torch.log" 2>&1
  grep -o '"model": "[a-z0-9]*".*"prec": "[a-z0-9_]*".*"graph_ms": [0-9.]*' "$OUT/torch.log" \
    | sed 's/"size.*"prec"/ "prec"/; s/"gflops.*"graph_ms"/ graph_ms/'
fi
if has bench; then
  echo "== bench ($(date +%T))"
  bench() {   # MODEL PRECISION [ARGS]
    timeout 70 python3 -m yolo_cl bench "$1" --precision "$2" --device 0:0 --repeat 10 --peak 63600 "${@:3}" 2>&1 \
      | sed "s/^/[$1 $2 ${*:3}] /"
  }
  { bench yolov3 fp32 --size 416; bench yolov3 fp16 --size 416; bench yolov3 tf32 --size 416
    bench yolov4 fp16 --size 416; bench yolov3 fp16 --size 608 --batch 8; } > "$OUT/bench.txt"
  grep -h "device time\|wall\|launches" "$OUT/bench.txt" | head -n 30
fi
if has host; then
  echo "== host ($(date +%T))"
  # library1.mp4 has 69 frames: played 6 times over (mp4v) the rates are the steady state, not start-up
  python3 -c "import cv2; f=[]; c=cv2.VideoCapture('.bench/library1.mp4')
while True:
    ok, x = c.read()
    if not ok: break
    f.append(x)
h, w = f[0].shape[:2]; o=cv2.VideoWriter('/tmp/loop.mp4', cv2.VideoWriter_fourcc(*'mp4v'), 30, (w, h))
[o.write(x) for _ in range(6) for x in f]; o.release()"
  YOLO_CL_DEVICE=0:0 timeout 240 python3 tools/bench_host.py --models "${HOST_MODELS:-yolov3-tiny:416:1,yolov3:416:1,yolov3:608:8}" \
    --precision fp32,fp16 --reps 20 --video "${HOST_VIDEO-/tmp/loop.mp4}" --video-frames 400 \
    --json "$OUT/host.json" > "$OUT/host.log" 2>&1
  tail -n 40 "$OUT/host.log"
fi
if has build; then
  echo "== build ($(date +%T))"
  YOLO_CL_DEVICE=0:0 timeout 300 python3 tools/bench_first_run.py --rounds 2 --modes threads1,threads8 \
    models/images/dog.jpg -- --model yolov3 --weights /tmp/w/yolov3.weights --thresh 1 > "$OUT/build.log" 2>&1
  cat "$OUT/build.log"
fi
if has serve; then
  echo "== serve ($(date +%T))"
  DEV="--device 0:0"; [ "$NGPU" -ge 2 ] && DEV="--devices all"
  timeout 200 python3 tools/bench_serve.py --size 416 --batch 8 --concurrency 128 --seconds 10 --rounds 2 \
    --skip streams --workers 1,2,4,8 --image models/images/dog.jpg $DEV --json "$OUT/serve.json" > "$OUT/serve.log" 2>&1
  timeout 90 python3 tools/bench_serve.py --size 416 --streams 4 --skip detector,serve --clip .bench/library1.mp4 --image models/images/dog.jpg \
    $DEV --json "$OUT/streams.json" > "$OUT/streams.log" 2>&1
  tail -n 30 "$OUT/serve.log"; tail -n 12 "$OUT/streams.log"
fi
serve_v3() {   # TIMEOUT WORKERS CLIENTS DEVICE-ARGS...: yolov3 416 fp16 served (random weights, no box passes)
  timeout "$1" python3 tools/bench_serve.py --model models/cfg/yolov3.cfg --weights /tmp/w/yolov3.weights --thresh 1 \
    --precision fp16 --size 416 --batch 8 --concurrency "$3" --seconds 6 --rounds 2 --skip streams --workers "$2" \
    --image models/images/dog.jpg "${@:4}"
}
if has wait; then
  echo "== wait ($(date +%T))"
  DEV="--device 0:0"; [ "$NGPU" -ge 2 ] && DEV="--devices all"
  for w in ${WAIT_MODES:-driver sleep callback}; do
    YOLO_CL_WAIT=$w serve_v3 120 $((4 * NGPU)) $((96 * NGPU)) $DEV > "/tmp/wait-$w.log" 2>&1
    grep -h "detect_batch x\|POST /detect x\|\[server\]\|lost" "/tmp/wait-$w.log" | sed "s/^/[YOLO_CL_WAIT=$w] /"
    cat "/tmp/wait-$w.log" >> "$OUT/wait.log"
  done
fi
if has scale; then
  echo "== scale ($NGPU GPUs, YOLO_CL_WAIT=${YOLO_CL_WAIT:-default}, $(date +%T))"
  scale() {   # TAG DEVICES V3-WORKERS TINY-WORKERS ('-': none) DEVICES-COUNT: serve and streams on DEVICES
    local tag="$1-${YOLO_CL_WAIT:-default}"
    serve_v3 150 "$3" $((96 * $5)) $2 --json "$OUT/scale-v3-$tag.json" > "$OUT/scale-v3-$tag.log" 2>&1
    [ "$4" != - ] && timeout 80 python3 tools/bench_serve.py --size 416 --batch 8 --concurrency $((64 * $5)) --seconds 6 \
      --rounds 2 --skip streams --workers "$4" --image models/images/dog.jpg $2 --json "$OUT/scale-tiny-$tag.json" \
      > "$OUT/scale-tiny-$tag.log" 2>&1
    [ -z "${SCALE_NO_STREAMS:-}" ] && timeout 70 python3 tools/bench_serve.py --size 416 --streams 8 --device-processes \
      --skip detector,serve --clip .bench/library1.mp4 --clip-repeat 4 --image models/images/dog.jpg $2 \
      --json "$OUT/scale-streams-$tag.json" > "$OUT/scale-streams-$tag.log" 2>&1
    grep -h "detect_batch x\|POST /detect x\|streams (\|\[server\]\|lost" "$OUT"/scale-*-"$tag".log | sed "s/^/[$tag] /"
  }
  scale one "--device 0:0" "${SCALE_ONE_WORKERS:-4}" - 1
  [ "$NGPU" -ge 2 ] && scale all "--devices all" $((4 * NGPU)) $((8 * NGPU)) "$NGPU"
fi
if has stress; then
  echo "== stress ($(date +%T))"
  stress() {   # TAG DEVICE PROCESSES THREADS [ARGS]
    timeout 120 python3 tools/stress_device_path.py --model yolov3-tiny --size 416 --device "$2" --processes "$3" \
      --threads "$4" --seconds "${STRESS_SECONDS:-10}" "${@:5}" > "$OUT/stress-$1.log" 2>&1
    grep -v "PyOpenCL WARNING\|failed with code\|CompilerWarning\|_prg.build" "$OUT/stress-$1.log" | sed "s/^/[stress $1] /"
  }
  stress 1x16 0:0 1 16
  stress 1x16-fp16 0:0 1 16 --precision fp16
  stress 8x8 0:0 8 8
  if [ "$NGPU" -ge 2 ]; then
    stress gpu0-8x8 0:0 8 8 & stress gpu1-8x8 0:1 8 8 & wait
    # the server that lost requests in the tenth and eleventh sessions: yolov3-tiny, 8 workers per GPU
    timeout 90 python3 tools/bench_serve.py --size 416 --batch 8 --concurrency $((64 * NGPU)) --seconds 6 --rounds 1 \
      --skip streams --workers $((8 * NGPU)) --image models/images/dog.jpg --devices all > "$OUT/stress-serve.log" 2>&1
    grep -h "POST /detect x\|\[server\]\|lost or failed\|Error" "$OUT/stress-serve.log" | cut -c1-600 | head -n 20
  fi
fi
if has streams; then
  echo "== streams ($(date +%T))"
  timeout 150 python3 tools/bench_serve.py --size 416 --streams 8 --stream-rounds 3 --clip-repeat 6 --skip detector,serve \
    --clip .bench/library1.mp4 --image models/images/dog.jpg --device 0:0 --json "$OUT/streams8.json" > "$OUT/streams8.log" 2>&1
  grep -h "streams" "$OUT/streams8.log"
fi
if has profile; then
  echo "== profile ($(date +%T))"
  # where 8 file streams in one process spend their threads' time (py-spy, its wheel in .whl/)
  timeout 100 /tmp/site/bin/py-spy record --format raw --rate 250 --nonblocking -o "$OUT/streams-profile.txt" -- \
    python3 tools/bench_serve.py --size 416 --streams 8 --stream-rounds 1 --clip-repeat 6 --skip detector,serve \
    --clip .bench/library1.mp4 --image models/images/dog.jpg --device 0:0 2>&1 | grep "streams (" | cut -c1-300
  python3 - "$OUT/streams-profile.txt" <<'PY'
import collections, sys
own = collections.Counter()
for line in open(sys.argv[1]):
    stack, _, n = line.rstrip().rpartition(" ")
    if stack:
        own[stack.split(";")[-1]] += int(n)
total = sum(own.values())
for frame, n in own.most_common(15):
    print(f"[profile] {100 * n / total:5.1f}% {frame[:140]}")
PY
fi
if has tests; then
  echo "== tests ($(date +%T))"
  mkdir -p ../shared/videos && cp -r .bench/images ../shared/ && cp .bench/library1.mp4 ../shared/videos/
  YOLO_CL_DEVICE=0:0 timeout "${TESTS_TIMEOUT:-240}" python3 -m pytest -q -x -p no:cacheprovider tests/test_launch.py \
    tests/test_device_nms.py tests/test_device_prepost.py tests/test_inflight.py tests/test_staging.py \
    tests/test_fleet.py tests/test_waiting.py > "$OUT/tests.log" 2>&1
  tail -n 8 "$OUT/tests.log"
fi
if has split; then
  echo "== split ($(date +%T))"
  for round in 1 2; do
    for sum in launch kernel; do
      YOLO_CL_MMA_SPLIT_SUM=$sum timeout 60 python3 -m yolo_cl bench yolov3 --precision fp16 --size 416 --device 0:0 \
        --repeat 20 --peak 63600 --weights /tmp/w/yolov3.weights > "/tmp/split-$sum.txt" 2>&1
      grep -h "device time\|end to end\|launches per" "/tmp/split-$sum.txt" | sed "s/^/[yolov3 fp16, split sum: $sum, round $round] /"
    done
  done
  cat /tmp/split-launch.txt /tmp/split-kernel.txt > "$OUT/split.txt"
fi
echo "== done ($(date +%T))"
