#!/usr/bin/env bash
# Issue 28 on a lent GPU machine, in one call (no internet there; Python 3.12 with
# torch and torchvision; our wheels come in .whl/, see the report of branch gpu):
#   run(command="bash tools/device_gpu.sh", carry=[".whl"], timeout_s=420)
# (PROBE=1 first runs tools/probe_gpu.py: where a batch's time goes)
# Installs the missing pure-Python packages (and simplejpeg, PyYAML) into /tmp/site,
# builds the C extensions for this Python (the pure-Python references if that fails),
# runs the CUDA tests, then tools/bench_gpu.py. Every step has its own time limit, so
# that a hang costs that step only; results land in $OUT as they are made.
set -x
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
SITE=${SITE:-/tmp/site}          # where the wheels go
BENCH_ARGS=${BENCH_ARGS:-}       # --small to try the script on a CPU machine
mkdir -p "$OUT"
cd "$(dirname "$0")/.."

# 1. wheels: pip where it is, else unzip them (a wheel is a zip of its site-packages)
mkdir -p "$SITE"
timeout 90 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --target "$SITE" .whl/*.whl \
  || timeout 60 python3 -c "import glob, sys, zipfile; [zipfile.ZipFile(w).extractall(sys.argv[1]) for w in glob.glob('.whl/*.whl')]" "$SITE"
export PYTHONPATH=$SITE:$PWD

# 2. the C extensions for this Python; without them, the Python references
if ! timeout 120 python3 -c "from setuptools import setup; setup()" build_ext --inplace \
    > "$OUT/build_ext.txt" 2>&1; then
  tail -20 "$OUT/build_ext.txt"
  export INDEXTAR_PURE_PYTHON=1
fi

# 3. what this machine is
nvidia-smi -L
timeout 60 python3 - <<'EOF' 2>&1 | tee "$OUT/versions.txt"
import platform, torch, indextar, indextar.native
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda,
      "device", torch.cuda.get_device_name() if torch.cuda.is_available() else None)
print("indextar", indextar.__file__, "extensions", indextar.native.built())
print("on_gpu backend", indextar.ImageStage().backend)
for name in ("torchvision", "webdataset", "simplejpeg", "sqlite_utils", "nvidia.dali"):
    try:
        __import__(name)
        print(name, "importable")
    except ImportError as e:
        print(name, "missing:", e)
EOF

# 4. the CUDA tests, and the stage's CPU tests on this Python (no -x: one call, all figures;
# warnings are not errors here: this step checks behaviour, CI checks warnings)
timeout 150 python3 -m pytest -q -p no:cacheprovider -rP \
    -W "ignore::DeprecationWarning" -W "ignore::UserWarning" --timeout 120 \
    tests/read/test_image_gpu.py tests/read/test_gpu_stage.py tests/read/test_shmblocks.py 2>&1 | tee "$OUT/pytest.txt" | tail -40

# 5. where a batch's time goes, in memory (PROBE=1): tools/probe_gpu.py
if [ "${PROBE:-0}" = 1 ]; then
  timeout 150 python3 tools/probe_gpu.py > /dev/null 2> "$OUT/probe_log.txt"
  echo "probe exit $?"
  grep -E "^\[" "$OUT/probe_log.txt" | cut -c1-400
fi

# 6. the benchmark; it rewrites its outputs after each row, so a cut run keeps them
timeout 240 python3 tools/bench_gpu.py $BENCH_ARGS --json-out "$OUT/bench_gpu.json" --out "$OUT/bench_gpu.md" \
    > /dev/null 2> "$OUT/bench_log.txt"
echo "bench exit $?"
tail -30 "$OUT/bench_log.txt"
cat "$OUT/bench_gpu.md"
