#!/bin/sh
# `wolfpack` in the images: the CLI from the source tree on PYTHONPATH (the project is not pip-installed, so
# a synced tree is what runs). With no arguments it serves the image's own service on every interface
# (Kubernetes passes explicit args; the server refuses to start there without WOLFPACK_ADMIN_SECRET).
# The web image runs `wolfpack web` instead (an HTTP app, not a gRPC service; WOLFPACK_WEB_* settings).
if [ "$#" -eq 0 ] && [ "${IMAGE_SERVICE:-}" = "web" ]; then
  set -- web
elif [ "$#" -eq 0 ]; then
  set -- serve "${IMAGE_SERVICE:?IMAGE_SERVICE is not set}" --address 0.0.0.0:50051
fi
exec python -m wolfpack.cli.main "$@"
