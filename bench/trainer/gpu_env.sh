# Source on the GPU machine (bash), from the repo root, after far.sh installed the staged wheels into /tmp/site
# (../shared/gpu/README.md). It adds what the project needs beyond vLLM/verl (grpcio 1.85 for our generated
# stubs, grpc health/reflection, OpenTelemetry's grpc instrumentation, redis-py, pytest-asyncio: wheels in
# .wb/extra, installed once into their own /tmp/xsite so they never replace /tmp/site's packages) and puts
# the project's source folders on PYTHONPATH.
. /tmp/site/env.sh
if [ ! -f /tmp/xsite/.done ]; then
  [ -d .wb/extra ] || { echo "gpu_env.sh: /tmp/xsite is empty and .wb/extra did not travel: carry it" >&2; return 1; }
  PIP_ROOT_USER_ACTION=ignore python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --target /tmp/xsite .wb/extra/*.whl && touch /tmp/xsite/.done
fi
_wp_root=$(pwd)
export PYTHONPATH=/tmp/xsite:$PYTHONPATH:$_wp_root/libs:$_wp_root/services/environment:$_wp_root/services/reward:$_wp_root/services/inference:$_wp_root/services/trainer:$_wp_root/services/curriculum:$_wp_root/services/rollout
export PYTHONUNBUFFERED=1
unset _wp_root
