#!/usr/bin/env bash
# The last staging call of a hold on a lent GPU machine (after the bundle calls of stage.sh's CALLS.txt, the
# smolA / smolB calls and the extra call, which left the wheels in /tmp/extra and SmolLM2's last piece in
# /tmp/smol), carrying .wb/src:
#
#   PLAN=s23 bash bench/trainer/hold_start.sh      # then poll.sh calls, back to back
#
# It starts gpu_hold_x4.sh in the background from a snapshot of the committed tree (/tmp/src, unpacked from
# .wb/src/src.tar: stage.sh's `git archive HEAD`), never from the repository root the calls run in. Why: every
# `run` call copies the working tree into that root again, and a process that imports a module while the copy
# is under way finds the file missing. Seen in s22 (bench/results/2026-11-28-h200x4-hold-s22.md): the GPU test's
# `wolfpack train` subprocess died with "No module named 'wolfpack_trainer.batch'" 21 s into the hold, as the
# first polling call began; the traceback showed no source lines for the root's files (unreadable at that moment).
# Environment passed through to the plan: PLAN, FINISH_AFTER_S, MIN_* (gpu_hold_x4.sh).
set -eo pipefail
[ -f .wb/src/src.tar ] || { echo "hold_start.sh: .wb/src/src.tar did not travel: carry .wb/src" >&2; exit 2; }
# Since s26 the extra wheels travel in a call of their own: with them, .wb/src and the working tree one call
# carried ~65 MiB, over the 64 allowed (the wheels grew: matplotlib 3.11). Carried here, they still serve.
mkdir -p /tmp/smol /tmp/out /tmp/pollout /tmp/extra
if [ -d .wb/smolC ]; then cp .wb/smolC/* /tmp/smol/; fi
if [ -d .wb/extra ]; then cp .wb/extra/* /tmp/extra/; fi
[ -f /tmp/smol/part3 ] || { echo "hold_start.sh: SmolLM2's part3 is not in /tmp/smol: make the extra call first" >&2; exit 2; }
ls /tmp/extra/*.whl > /dev/null 2>&1 || { echo "hold_start.sh: no wheels in /tmp/extra: make the extra call first" >&2; exit 2; }
rm -rf /tmp/src && mkdir -p /tmp/src/.wb
tar -xf .wb/src/src.tar -C /tmp/src
cp -r /tmp/extra /tmp/src/.wb/extra  # gpu_env.sh installs these into /tmp/xsite on first use
cd /tmp/src
# shellcheck disable=SC1091  # written on the lent machine by far.sh
. bench/trainer/gpu_env.sh
(SMOL=/tmp/smol OUT=/tmp/out setsid nohup bash bench/trainer/gpu_hold_x4.sh > /tmp/hold.log 2>&1 < /dev/null &)
sleep 20
tail -n 5 /tmp/hold.log
