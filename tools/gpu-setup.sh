#!/bin/bash
# Source on the GPU machine, from the repo root:   . tools/gpu-setup.sh
# (adapted from shared/gpu/setup.sh, which does not travel with the device tool)
# Needs, carried with the call: .whl/ (cp312 wheels: pyopencl, pytools, platformdirs, siphash24, typing_extensions;
# pytest-xdist and execnet, which the suite's addopts (-n 2) need)
# and optionally .whl2/ (made by make-opencv-lite.sh: OpenCV 4.10 with the Darknet importer, slimmed to ~18 MB, and CLBlast).
# e.g. run(command=". tools/gpu-setup.sh && python3 -m yolo_cl.cli bench ...", carry=[".whl", ".whl2"])
# The package source lives in engine/ but is imported as yolo_cl: /tmp/src/yolo_cl -> $(pwd)/engine, /tmp/src on PYTHONPATH.
export PYTHONUNBUFFERED=1
mkdir -p /tmp/icd && echo /usr/local/nvidia/lib64/libnvidia-opencl.so.1 > /tmp/icd/nvidia.icd
export OCL_ICD_VENDORS=/tmp/icd                      # NVIDIA's OpenCL driver is present but not registered
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || return 1
[ -d engine ] || { echo "gpu-setup.sh: no engine/ here; source it from the repo root" >&2; return 1; }
mkdir -p /tmp/src && rm -rf /tmp/src/yolo_cl && ln -s "$(pwd)/engine" /tmp/src/yolo_cl || return 1
# engine/resources.py resolves the symlink, so cl/, models/, configs/ are found beside engine/ in the repo root
export PYTHONPATH=/tmp/site:/tmp/src${PYTHONPATH:+:$PYTHONPATH}
if [ -f .whl2/ocvlite.tar.xz ]; then                 # OpenCV 4.x shadows the machine's OpenCV 5 (which has no Darknet importer)
  mkdir -p /tmp/ocvlite /tmp/ocl
  [ -f /tmp/ocvlite/cv2/cv2.abi3.so ] || tar -C /tmp/ocvlite -xJf .whl2/ocvlite.tar.xz
  [ -f /tmp/ocl/libclblast.so.1 ] || xz -dc .whl2/libclblast.so.1.xz > /tmp/ocl/libclblast.so.1
  # OpenCV must load the system OpenCL loader (/usr/lib/x86_64-linux-gnu/libOpenCL.so.1); pyopencl's bundled one segfaults it
  export LD_LIBRARY_PATH=/tmp/ocl:${LD_LIBRARY_PATH:-}
  export PYTHONPATH=/tmp/ocvlite:$PYTHONPATH
  export OPENCV_DNN_OPENCL_ALLOW_ALL_DEVICES=1        # else OpenCV's DNN quietly runs on the CPU on non-Intel GPUs
fi
python3 -c "import pyopencl as cl; print([d.name for p in cl.get_platforms() for d in p.get_devices()])"
