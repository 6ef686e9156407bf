"""gRPC adapter of the inference service: proto <-> ``PolicyRegistry`` (prompt logic in ``policies.py``
and ``prompts.py``, engines in ``backends/``). Start it with ``wolfpack serve inference``; the served
policies come from ``WOLFPACK_INFERENCE_*`` (see ``config.py``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any, NoReturn

import grpc

from wolfpack import rpc, telemetry
from wolfpack.settings import Settings
from wolfpack.v1 import common_pb2
from wolfpack.v1 import inference_service_pb2 as pb
from wolfpack.v1 import inference_service_pb2_grpc as pb_grpc
from wolfpack_inference.backends.base import ErrorCode, Finish, InferenceError, Result
from wolfpack_inference.policies import Policy, PolicyRegistry, Prepared, TensorAssembler, make_sampling
from wolfpack_inference.settings import InferenceSettings

SERVICE = "inference"
_FINISH = {Finish.LENGTH: pb.FINISH_REASON_LENGTH, Finish.STOP: pb.FINISH_REASON_STOP, Finish.ABORT: pb.FINISH_REASON_ABORT}  # fmt: skip
_tracer = telemetry.tracer("wolfpack.inference")


async def _abort(context: grpc.aio.ServicerContext[Any, Any], exc: InferenceError) -> NoReturn:
    await context.abort(getattr(grpc.StatusCode, exc.code.value), str(exc))
    raise AssertionError("unreachable")


def policy_info(p: Policy) -> pb.PolicyInfo:
    return pb.PolicyInfo(
        policy=common_pb2.PolicyRef(policy_id=p.policy_id, version=p.version),
        base_model=p.backend.model, adapter=p.backend.adapter, backend=p.backend.name,
        context_budget=p.context_budget,
    )  # fmt: skip


class InferenceServicer(pb_grpc.InferenceServiceServicer):
    def __init__(self, registry: PolicyRegistry) -> None:
        self.registry = registry

    def _prepare(self, r: pb.GenerateRequest) -> tuple[Policy, Prepared]:
        policy = self.registry.get(r.policy_id)
        s = r.sampling
        sampling = make_sampling(
            max_tokens=s.max_tokens, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, stop=s.stop,
            seed=s.seed if s.HasField("seed") else None, n=s.n, logprobs=s.logprobs,
        )  # fmt: skip
        if r.WhichOneof("prompt") == "chat":
            msgs = [{"role": m.role, "content": m.content, "name": m.name} for m in r.chat.messages]
            # the field has presence: unset leaves the choice to ``prepare`` (continuation or not)
            add_gen = r.chat.add_generation_prompt if r.chat.HasField("add_generation_prompt") else None
            return policy, policy.prepare(sampling, messages=msgs, add_generation_prompt=add_gen,
                                          request_id=r.request_id)  # fmt: skip
        return policy, policy.prepare(sampling, token_ids=r.tokens.token_ids, request_id=r.request_id)

    def _span(self, policy: Policy, r: pb.GenerateRequest) -> Any:
        """A span following the GenAI conventions, child of the caller's trace (the server interceptor
        made it current)."""
        op = "chat" if r.WhichOneof("prompt") == "chat" else "text_completion"
        attrs = telemetry.gen_ai_attributes(
            operation=op, model=policy.backend.model, temperature=r.sampling.temperature,
            top_p=r.sampling.top_p or 1.0, max_tokens=r.sampling.max_tokens, policy_id=policy.policy_id,
        )  # fmt: skip
        attrs["wolfpack.request_id"] = r.request_id
        return _tracer.start_as_current_span(f"{op} {policy.policy_id}", attributes=attrs)

    async def Generate(self, request: pb.GenerateRequest, context: Any) -> pb.GenerateResponse:
        try:
            policy, prep = self._prepare(request)
            with self._span(policy, request) as span:
                result: Result = await policy.backend.generate(prep.request)
                out = sum(len(c.token_ids) for c in result.completions)
                span.set_attributes({
                    "gen_ai.usage.input_tokens": result.prompt_tokens, "gen_ai.usage.output_tokens": out,
                    "gen_ai.response.finish_reasons": [c.finish.value for c in result.completions],
                    "wolfpack.policy.version": result.version,
                })  # fmt: skip
        except InferenceError as exc:
            await _abort(context, exc)
        resp = pb.GenerateResponse(
            prompt_token_ids=result.prompt_ids, prompt_compressed=prep.compressed,
            usage=pb.Usage(prompt_tokens=result.prompt_tokens, completion_tokens=out),
            policy=common_pb2.PolicyRef(policy_id=policy.policy_id, version=result.version),
        )  # fmt: skip
        for c in result.completions:
            resp.completions.add(token_ids=c.token_ids, logprobs=c.logprobs, text=c.text,
                                 finish_reason=_FINISH[c.finish])  # fmt: skip
        return resp

    async def GenerateStream(
        self, request: pb.GenerateStreamRequest, context: Any
    ) -> AsyncIterator[pb.GenerateStreamResponse]:
        try:
            policy, prep = self._prepare(request.request)
            with self._span(policy, request.request):
                first = True
                async for ch in policy.backend.stream(prep.request):
                    msg = pb.GenerateStreamResponse(
                        token_ids=ch.token_ids, logprobs=ch.logprobs, text=ch.text,
                        finish_reason=_FINISH[ch.finish] if ch.finish else pb.FINISH_REASON_UNSPECIFIED,
                        policy=common_pb2.PolicyRef(policy_id=policy.policy_id, version=ch.version),
                    )  # fmt: skip
                    if first:
                        msg.prompt_token_ids.extend(prep.request.prompt_ids)
                        first = False
                    yield msg
        except InferenceError as exc:
            await _abort(context, exc)

    async def ListPolicies(self, request: pb.ListPoliciesRequest, context: Any) -> pb.ListPoliciesResponse:
        return pb.ListPoliciesResponse(policies=[policy_info(p) for p in self.registry.list()])

    async def LoadPolicy(self, request: pb.LoadPolicyRequest, context: Any) -> pb.LoadPolicyResponse:
        try:
            p = await self.registry.load(
                request.policy_id, request.version, request.model_path, request.adapter_path
            )
        except InferenceError as exc:
            await _abort(context, exc)
        return pb.LoadPolicyResponse(policy=policy_info(p))

    async def PushWeights(
        self, request_iterator: AsyncIterator[pb.PushWeightsRequest], context: Any
    ) -> pb.PushWeightsResponse:
        assembler, head = TensorAssembler(), None
        try:
            async for chunk in request_iterator:
                head = head or chunk
                assembler.add(chunk.name, chunk.dtype, chunk.shape, chunk.data, chunk.offset)
            if head is None:
                raise InferenceError(ErrorCode.INVALID_ARGUMENT, "no chunks received")
            tensors = await asyncio.to_thread(assembler.tensors)
            p = await self.registry.push(
                head.policy_id, head.version, tensors, head.is_adapter, head.adapter_config_json
            )
        except InferenceError as exc:
            await _abort(context, exc)
        return pb.PushWeightsResponse(policy=policy_info(p), tensors=len(tensors))


def register(server: grpc.aio.Server, servicer: InferenceServicer | None = None) -> Sequence[str]:
    """Add this service's servicers to ``server`` and return their full names."""
    if servicer is None:
        s = InferenceSettings()
        servicer = InferenceServicer(PolicyRegistry.from_configs(s.policies(), s.cache_dir))
    pb_grpc.add_InferenceServiceServicer_to_server(servicer, server)
    return [pb.DESCRIPTOR.services_by_name["InferenceService"].full_name]


async def main(settings: Settings, address: str | None = None) -> None:
    s = InferenceSettings()
    registry = await asyncio.to_thread(PolicyRegistry.from_configs, s.policies(), s.cache_dir)
    servicer = InferenceServicer(registry)
    front = None
    if s.http_addr:  # the OpenAI-compatible front shares the registry (same weights, same batches)
        from wolfpack_inference.http_api import HttpFront

        host, _, port = s.http_addr.rpartition(":")
        front = HttpFront(registry, s.http_api_key.get_secret_value())
        await front.start(host, int(port))

    async def on_stop() -> None:
        if front is not None:
            await front.stop()
        await registry.close()

    await rpc.serve(SERVICE, lambda server: register(server, servicer), settings, address, on_stop=on_stop)
