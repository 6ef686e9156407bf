"""``wolfpack serve ...`` with other HTTP/2 transport options than this tree's (``bench_env_cpu.py
--transports``): the first argument is the options as JSON (``[["grpc.http2.bdp_probe", 0], ...]``), put
in place of ``wolfpack.rpc.HTTP2_OPTIONS`` before the server starts; the rest are the CLI's arguments.

    python bench/env/serve_transport.py '[]' serve environment --address 127.0.0.1:50051
"""

from __future__ import annotations

import json
import sys

from wolfpack import rpc


def main() -> None:
    rpc.HTTP2_OPTIONS[:] = [(str(k), int(v)) for k, v in json.loads(sys.argv[1])]
    sys.argv = [sys.argv[0], *sys.argv[2:]]
    from wolfpack.cli.main import main as cli

    cli()


if __name__ == "__main__":
    main()
