#!/bin/bash
# One device call that measures what BENCHMARKS.md reports for the GPU issues, on a 1- or 2-GPU
# NVIDIA host (run from the repo root, with .whl/ and .bench/ carried; see tools/gpu-setup.sh):
#   .bench/ holds torch_darknet.py and make_weights.py (the PyTorch peer, from ../shared/gpu) and
#   library1.mp4 (the portrait clip, from ../shared/videos).
#   run(command="bash tools/gpu-bench-session.sh", carry=[".whl", ".bench"], kind="nvidia-h200-x2")
# Phases (each bounded by its own timeout so one slow phase cannot starve the rest):
#   A. the PyTorch + cuDNN peer on the same cfgs (fp32 IEEE / TF32 / fp16, eager and CUDA graphs), alone;
#   B. yolo-cl bench (device time per layer) for yolov3 fp32/fp16/tf32 and yolov4 fp16 on GPU 0, and
#      tools/bench_host.py (the host path: run/forward/detect wall, launches, flushes, video) on GPU 1
#      (on GPU 0 after them on a 1-GPU host);
#   C. tools/bench_serve.py on one device, then on every device (issue 23).
set -u
. tools/gpu-setup.sh > /tmp/setup.log 2>&1 || { cat /tmp/setup.log; exit 1; }
NGPU=$(nvidia-smi -L | wc -l)
mkdir -p /tmp/w
for m in yolov3 yolov4; do python3 .bench/make_weights.py models/cfg/$m.cfg /tmp/w/$m.weights > /dev/null; done
echo "== A: PyTorch peer ($(date +%T))"
timeout 100 python3 .bench/torch_darknet.py bench "$OUT/torch.json" \
  tiny:models/yolov3-tiny.cfg:models/yolov3-tiny.weights:416:1 \
  v3:models/cfg/yolov3.cfg:/tmp/w/yolov3.weights:416:1 v4:models/cfg/yolov4.cfg:/tmp/w/yolov4.weights:416:1 \
  > "$OUT/torch.log" 2>&1
echo "== B: yolo-cl bench and bench_host ($(date +%T))"
bench() {   # MODEL PRECISION DEVICE
  timeout 55 python3 -m yolo_cl bench "$1" --size 416 --precision "$2" --device "$3" --repeat 10 --peak 63600 2>&1 \
    | sed "s/^/[$1 $2] /"
}
host() {
  YOLO_CL_DEVICE="$1" timeout 200 python3 tools/bench_host.py --models yolov3-tiny:416:1,yolov3:416:1 \
    --precision fp32 --reps 20 --flush 4,16 --video .bench/library1.mp4 --video-frames 150 \
    --json "$OUT/host.json" > "$OUT/host.log" 2>&1
}
if [ "$NGPU" -ge 2 ]; then
  host 0:1 &
fi
{ bench yolov3 fp32 0:0; bench yolov3 fp16 0:0; bench yolov3 tf32 0:0; bench yolov4 fp16 0:0; } > "$OUT/bench.txt"
if [ "$NGPU" -ge 2 ]; then wait; else host 0:0; fi
echo "== C: serving, one device then every device ($(date +%T))"
serve() {   # JSON DEVICE-OPTION
  timeout 100 python3 tools/bench_serve.py --size 416 --batch 8 --concurrency 32 --seconds 8 --rounds 2 \
    --streams 4 --image models/images/dog.jpg --clip .bench/library1.mp4 --json "$OUT/$1" "${@:2}" 2>&1
}
{ serve serve1.json --device 0:0; [ "$NGPU" -ge 2 ] && serve serve2.json --devices all; } > "$OUT/serve.log"
echo "== done ($(date +%T))"
grep -h "device time\|^\[.*\] *total\|wall" "$OUT/bench.txt" | head -20
tail -n 4 "$OUT/host.log" "$OUT/serve.log" "$OUT/torch.log"
