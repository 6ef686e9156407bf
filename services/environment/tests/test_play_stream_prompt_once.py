"""``PlaySeatsRequest.omit_messages`` (the prompt sent once) over real gRPC.

The flag changes the bytes on the wire and nothing a caller of ``EnvironmentClient.play_stream`` sees:
the rollout driver passes ``obs.messages`` straight to GenerateBatch, so the messages the client rebuilds
must be exactly the ones the server sends without the flag. Checked over whole seeded games (6, 9 and
12 players, English and Chinese prompts, re-prompts after unreadable answers, the final observations),
every decision compared byte for byte. A raw stream shows the flag really takes the second copy off the
wire, and that a client without it (every client written before it) still gets the messages.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import pytest

from wolfpack.v1 import common_pb2
from wolfpack.v1 import environment_service_pb2 as pb
from wolfpack_environment.client import EnvironmentClient, episode_request, restore_messages

pytestmark = pytest.mark.timeout(180)

WAIT_S = 20.0


def answer(obs: pb.Observation, rng: random.Random) -> str:
    """A model-like text answer: mostly a legal move written out, sometimes unreadable (a re-prompt)."""
    if rng.random() < 0.15 and not any(la.needs_text for la in obs.legal_actions):
        return "hmm, let me think about it"  # no move in it (speech phases take any text as speech)
    la = rng.choice(obs.legal_actions)
    if la.needs_text:
        return "I trust seat 2."
    return f"{la.kind} {rng.choice(la.targets) + 1}" if la.targets else la.kind


def comparable(obs: pb.Observation) -> bytes:
    """The decision without its episode id (a fresh uuid per run)."""
    copy = pb.Observation()
    copy.CopyFrom(obs)
    copy.episode_id = ""
    return copy.SerializeToString(deterministic=True)


Send = Callable[[str, list[tuple[str, int, str]]], Awaitable[None]]
"""Answers (token, turn id, text) for an episode, sent the way one of the two clients sends them."""


async def play_raw(client: EnvironmentClient, create: pb.CreateEpisodeRequest, **options: Any) -> list[bytes]:
    """One episode over a bare PlaySeats call (no client library in between), every seat answered with
    ``answer``; returns each decision received, in order."""
    call = client.stub.PlaySeats(timeout=120)
    await call.write(pb.PlaySeatsRequest(create=[create], include_text=True, **options))

    async def send(episode_id: str, acts: list[tuple[str, int, str]]) -> None:
        await call.write(pb.PlaySeatsRequest(acts=[
            pb.SeatAct(episode_id=episode_id, token=t, turn_id=turn, raw_text=text) for t, turn, text in acts
        ]))  # fmt: skip

    try:
        return await _drive(call.read, send, create.seed)
    finally:
        call.cancel()


async def play_client(client: EnvironmentClient, create: pb.CreateEpisodeRequest) -> list[bytes]:
    """The same episode through ``EnvironmentClient.play_stream`` (prompt once, messages rebuilt)."""
    stream = client.play_stream(include_text=True)
    stream.create(create)

    async def send(episode_id: str, acts: list[tuple[str, int, str]]) -> None:
        for token, turn_id, text in acts:
            stream.act(episode_id, token, turn_id, text)

    try:
        return await _drive(stream.read, send, create.seed)
    finally:
        await stream.close()


async def _drive(read: Callable[[], Awaitable[Any]], send: Send, seed: int) -> list[bytes]:
    """Play the stream's one episode to its end: every seat's final observation received."""
    rng = random.Random(seed)
    tokens: dict[int, str] = {}
    episode_id = ""
    received: list[bytes] = []
    finals: set[int] = set()
    while not tokens or finals != set(tokens):
        reply = await asyncio.wait_for(read(), WAIT_S)
        assert reply is not grpc.aio.EOF, "the stream ended early"
        for created in reply.created:
            assert not created.HasField("error"), created.error.message
            episode_id = created.episode.episode_id
            tokens = {t.seat: t.token for t in created.episode.seat_tokens}
        acts = []
        for obs in reply.decisions:
            received.append(comparable(obs))
            if obs.done:
                finals.add(obs.seat)
            elif obs.your_turn:
                acts.append((tokens[obs.seat], obs.turn_id, answer(obs, rng)))
        if acts:
            await send(episode_id, acts)
    return received


@pytest.mark.parametrize(("variant", "language"), [("6p", "en"), ("9p", "zh"), ("12p", "en")])
async def test_rebuilt_messages_are_the_servers(
    env_client: EnvironmentClient, variant: str, language: str
) -> None:
    players = int(variant.removesuffix("p"))
    for seed in range(3):
        create = episode_request(
            "werewolf_v1", variant, seed=seed, external_seats=tuple(range(players)), language=language
        )
        with_messages = await play_raw(env_client, create)
        rebuilt = await play_client(env_client, create)
        assert len(with_messages) > players  # a whole game: many decisions, then every seat's end
        assert any(pb.Observation.FromString(d).feedback for d in with_messages), "no re-prompt exercised"
        assert rebuilt == with_messages
        last = pb.Observation.FromString(with_messages[-1])
        assert last.done and len(last.messages) == 1 and last.messages[0].content == last.text


async def test_the_flag_sends_the_prompt_once(env_client: EnvironmentClient) -> None:
    create = episode_request("werewolf_v1", "6p", seed=7, external_seats=tuple(range(6)))
    once = [pb.Observation.FromString(d) for d in await play_raw(env_client, create, omit_messages=True)]
    twice = [pb.Observation.FromString(d) for d in await play_raw(env_client, create)]
    assert [o.text for o in once] == [o.text for o in twice]
    assert all(o.text and not o.messages for o in once)
    assert all(len(o.messages) == 1 and o.messages[0] == common_pb2.ChatMessage(role="user", content=o.text)
               for o in twice)  # fmt: skip
    assert sum(o.ByteSize() for o in once) < 0.6 * sum(o.ByteSize() for o in twice)


def test_restore_leaves_messages_a_server_sent_alone() -> None:
    """A server that predates the flag ignores it and sends messages: they are not doubled."""
    sent = pb.Observation(text="prompt", messages=[common_pb2.ChatMessage(role="user", content="prompt")])
    omitted = pb.Observation(text="prompt")
    decisions = [sent, omitted]
    restore_messages(decisions)
    assert sent.SerializeToString() == omitted.SerializeToString()
    assert len(sent.messages) == 1
