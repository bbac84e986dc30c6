#!/usr/bin/env bash
# One device run on a CUDA machine: install SGLang (and vLLM in its own venv), run tests/gpu, the
# engine contract against SGLang and vLLM, and bench/gpu.py; write to $OUT.
#
#   OUT=/tmp/gpu-out bash tests/gpu/run_on_device.sh
#
# Nothing is downloaded but packages from PyPI: the models are made locally
# (stacx.rollout.models.make_tiny_model). Every step's log and the bench JSON land in $OUT; the exit
# status is the first failing step's. No test skips: tests/gpu fails where CUDA or SGLang is missing.
set -uo pipefail
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
status=0
step() {  # step NAME COMMAND...: run it, log to $OUT/NAME.log, remember the first failure
  local name="$1"; shift
  echo "== $name: $*" | tee -a "$OUT/steps.log"
  "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "== $name: exit $rc" | tee -a "$OUT/steps.log"
  tail -n 20 "$OUT/$name.log"
  if [ "$rc" -ne 0 ] && [ "$status" -eq 0 ]; then status=$rc; fi
  return 0
}
nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1 || echo "nvidia-smi failed" >>"$OUT/steps.log"
if [ ! -x .venv/bin/python ]; then
  step venv python3 -m venv .venv
fi
PY=.venv/bin/python
step install "$PY" -m pip install --quiet -e ".[dev]" "sglang[all]"
step versions "$PY" -c "import torch, sglang; print(torch.__version__, torch.version.cuda, sglang.__version__, torch.cuda.get_device_name(0))"
step tests env STACX_GPU_TESTS=1 "$PY" -m pytest tests/gpu -q -x -p no:cacheprovider
# the engine contract (token ids, logprobs = transformers' within 1e-5, reload, versions, abort)
step contract-sglang env STACX_CONTRACT_ENGINES=sglang \
  "$PY" -m pytest tests/integration/inference/test_engine_contract.py -q -p no:cacheprovider
VLLM_VENV="${STACX_HOME:-$HOME/.cache/stacx}/venv-vllm-gpu"  # the official vllm pins its own torch
[ -x "$VLLM_VENV/bin/python" ] || step vllm-venv python3 -m venv "$VLLM_VENV"
step vllm-install "$VLLM_VENV/bin/python" -m pip install --quiet vllm
step contract-vllm env STACX_CONTRACT_ENGINES=vllm STACX_VLLM_PYTHON="$VLLM_VENV/bin/python" \
  "$PY" -m pytest tests/integration/inference/test_engine_contract.py -q -p no:cacheprovider
step bench "$PY" bench/gpu.py --json
tail -n 1 "$OUT/bench.log" >"$OUT/bench.json" 2>/dev/null || true
echo "results in $OUT (steps.log, tests.log, bench.json); exit $status"
exit "$status"
