#!/bin/bash
# What a lent GPU machine without tritonserver or redis-server runs (docs/voice.md, "On a GPU"):
# the asr pool served (python -m perf.asr_gpu_served), voice to first answer token
# served (perf.voice_gpu_served), then the same recognizers in process
# (perf.asr_gpu) for comparison. Prepared here (tools/gpu_pack.py):
#   python -m tools.gpu_pack asr --out build/gpu-pack
#   python -m tools.gpu_pack server; python -m tools.gpu_pack voice
#   .whl: this repository's wheel and the cp312 wheels the machine lacks (soundfile, soxr, cffi,
#   pycparser, tritonclient, python-rapidjson, protobuf, redis)
# Carried: build/gpu-served, build/gpu-pack/{default,small-source,audio/en,audio/en+zh}, .whl.
# Run from the repository's root: SERVED_S=270 VOICE_S=150 INPROC_S=100 bash tools/gpu-served.sh
OUT=${OUT:-$PWD/build/bench/gpu-served-run}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
R=$PWD
# the wheel's switchboard first, then the checkout for the bench suite (perf/ is not in the wheel)
export PYTHONPATH=/tmp/site:$R PYTHONUNBUFFERED=1
cd /tmp
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import sys, sysconfig; print(sys.version.split()[0], sys.executable, sys.base_prefix, sysconfig.get_config_var('LIBDIR'), sysconfig.get_config_var('Py_ENABLE_SHARED'))"
LIBDIR=$(python3 -c "import sysconfig; print(sysconfig.get_config_var('LIBDIR'))")
ls "$LIBDIR"/libpython3* 2>&1 | head -5
if ! ls "$LIBDIR"/libpython3.12.so.1.0 >/dev/null 2>&1; then
  LP=$(find /usr /opt /lib /root /home -name 'libpython3.12.so.1.0' 2>/dev/null | head -1)
  echo "libpython3.12 elsewhere: ${LP:-none}"
  [ -n "$LP" ] && export LD_LIBRARY_PATH=$(dirname "$LP")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
echo "== served"
timeout "${SERVED_S:-330}" python3 -m perf.asr_gpu_served run --pack "$R/build/gpu-pack" --server "$R/build/gpu-served" \
  --source "$R/model_repository" --out "$OUT/served" --models "${MODELS:-default,small-shape}" \
  --requests "${REQUESTS:-160,640}" --rounds "${ROUNDS:-2}" 2>&1 | grep -v "Loading weights\|Writing model"
echo "rc ${PIPESTATUS[0]}"
for f in "$OUT"/served/run/*/tritonserver-*.log; do echo "== $f"; grep -v "^I1\|^I0" "$f" | tail -15; done
echo "== voice"
timeout "${VOICE_S:-150}" python3 -m perf.voice_gpu_served run --pack "$R/build/gpu-pack" --server "$R/build/gpu-served" \
  --source "$R/model_repository" --out "$OUT/voice" --requests "${VOICE_REQUESTS:-10,32}" --rounds "${ROUNDS:-2}" 2>&1 | grep -v "Loading weights\|Writing model"
echo "rc ${PIPESTATUS[0]}"
for f in "$OUT"/voice/run/tritonserver-*.log; do echo "== $f"; grep -v "^I1\|^I0" "$f" | tail -15; done
[ -n "$NO_INPROCESS" ] && exit 0
echo "== in process"
timeout "${INPROC_S:-120}" python3 -m perf.asr_gpu run --pack "$R/build/gpu-pack" --out "$OUT/inproc" \
  --models "${MODELS:-default,small-shape}" --dtypes float16 --steps graphs-fitted --requests "${REQUESTS:-160,640}" \
  --no-transformers 2>&1 | grep -v "Loading weights\|Writing model"
echo "rc ${PIPESTATUS[0]}"
