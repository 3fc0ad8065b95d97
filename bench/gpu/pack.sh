#!/usr/bin/env bash
# Lay out what the GPU benchmarks carry to the H200 machine, in three loads of < 58 MiB
# (each device command carries at most 64 MiB with the working tree). Run from the
# project root, after `bash ../shared/gpu/pack-vllm.sh` (which downloads the wheels into
# .gpu/wheels and slims the vLLM wheel). Everything goes under .gpu/ (git-ignored):
#   .gpu/p1  the small wheels (pydantic, trl, uvicorn, ... for `import rlcoach`, TRL and
#            the vLLM OpenAI server) and the first part of the vLLM wheel
#   .gpu/p2  the second part;  .gpu/p3  the last part
#   .gpu/tok the bundled model's tokenizer and chat template (the gateway renders chats)
#   .gpu/t1  the small wheels alone (no vLLM): all that the trainer benchmark needs, TRL
#            included, in one load
# On the device, bench/gpu/device.sh p1|p2|p3 installs them in turn into /tmp/site.
set -euo pipefail
[ -f .gpu/vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl ] || { echo "run ../shared/gpu/pack-vllm.sh first"; exit 1; }
extra=(uvicorn==0.55.0 watchfiles==1.3.0 python-multipart==0.0.34 jmespath==1.1.0
       supervisor==4.3.0 prometheus-fastapi-instrumentator==8.1.0
       model-hosting-container-standards==0.1.16)
mkdir -p .gpu/extra .gpu/p1 .gpu/p2 .gpu/p3 .gpu/tok
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d .gpu/extra "${extra[@]}"
rm -f .gpu/p1/* .gpu/p2/* .gpu/p3/*
find .gpu/wheels -name '*.whl' ! -name 'vllm-*' -exec cp {} .gpu/p1/ \;
cp .gpu/extra/*.whl .gpu/p1/
rm -rf .gpu/t1 && mkdir -p .gpu/t1 && cp .gpu/p1/*.whl .gpu/t1/
small=$(du -cb .gpu/p1/*.whl | tail -1 | cut -f1)
first=$(( 54 * 1024 * 1024 - small ))
wheel=.gpu/vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl
python3 - "$wheel" "$first" <<'PY'
import sys
data = open(sys.argv[1], "rb").read()
first, size = int(sys.argv[2]), 58 * 1024 * 1024
for name, chunk in (("p1/vllm.part1", data[:first]), ("p2/vllm.part2", data[first:first + size]),
                    ("p3/vllm.part3", data[first + size:])):
    open(f".gpu/{name}", "wb").write(chunk)
PY
sha256sum "$wheel" | cut -d' ' -f1 > .gpu/p3/vllm.sha256
tok="${RLCOACH_CACHE:-$HOME/.cache/rlcoach}/models/smollm2-135m-instruct"
cp "$tok"/tokenizer.json "$tok"/tokenizer_config.json "$tok"/chat_template.jinja .gpu/tok/
du -sh .gpu/p1 .gpu/p2 .gpu/p3 .gpu/tok .gpu/t1
