"""``PlaySeatsRequest.omit_messages`` (the prompt sent once) over real gRPC.

The flag changes the bytes on the wire and nothing a caller of ``EnvironmentClient.play_stream`` sees:
the rollout driver passes ``obs.messages`` straight to GenerateBatch, so the messages the client rebuilds
must be exactly the ones the server sends without the flag. Checked over whole seeded games (6, 9 and
12 players, English and Chinese prompts, re-prompts after unreadable answers, the final observations),
every decision compared byte for byte. A raw stream shows the flag really takes the second copy off the
wire, and that a client without it (every client written before it) still gets the messages.

``PlaySeatsRequest.prompt_delta`` (each prompt sent as what is new since the seat's previous prompt on the
stream, ``Observation.text_shared_prefix_bytes`` + the rest) is checked the same way: every decision of
seeded whole games (6, 9 and 12 players, English and Chinese) compared byte for byte between a bare
stream without any flag and ``play_stream(prompt_delta=True)``, with and without the messages on the
wire. A bare stream with the flag shows the text really shrinks to fragments (so a client that skipped
the rebuild would differ) and that the proto's byte rule alone, as a client in another language applies
it, rebuilds every prompt.
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
from wolfpack_environment.client import (
    EnvironmentClient,
    PromptDeltaError,
    episode_request,
    restore_messages,
    restore_prompts,
)
from wolfpack_environment.play_stream import shared_prefix

pytestmark = pytest.mark.timeout(300)

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


async def play_client(
    client: EnvironmentClient, create: pb.CreateEpisodeRequest, **options: bool
) -> list[bytes]:
    """The same episode through ``EnvironmentClient.play_stream`` (by default prompt once, messages
    rebuilt; ``options`` go to ``play_stream``: ``prompt_delta=True`` rebuilds the prompts too)."""
    stream = client.play_stream(include_text=True, **options)
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


# --- prompt_delta ---------------------------------------------------------------------------------

GAMES = [(v, lang) for v in ("6p", "9p", "12p") for lang in ("en", "zh")]


def create(variant: str, language: str, seed: int) -> pb.CreateEpisodeRequest:
    players = int(variant.removesuffix("p"))
    return episode_request(
        "werewolf_v1", variant, seed=seed, external_seats=tuple(range(players)), language=language
    )


def rebuilt_by_bytes(decisions: list[bytes]) -> list[pb.Observation]:
    """The prompts of a raw ``prompt_delta`` stream rebuilt on UTF-8 bytes, by the proto's rule alone."""
    last: dict[tuple[str, int], bytes] = {}
    out = []
    for raw in decisions:
        obs = pb.Observation.FromString(raw)
        key = (obs.episode_id, obs.seat)
        whole = last.get(key, b"")[: obs.text_shared_prefix_bytes] + obs.text.encode("utf-8")
        last[key] = whole
        obs.text = whole.decode("utf-8")
        obs.ClearField("text_shared_prefix_bytes")
        out.append(obs)
    return out


@pytest.mark.parametrize(("variant", "language"), GAMES)
async def test_rebuilt_prompts_are_the_servers(
    env_client: EnvironmentClient, variant: str, language: str
) -> None:
    for seed in range(2):
        req = create(variant, language, seed)
        whole = await play_raw(env_client, req)
        assert any(pb.Observation.FromString(d).feedback for d in whole), "no re-prompt exercised"
        assert await play_client(env_client, req, prompt_delta=True) == whole  # with prompt once
        assert await play_client(env_client, req, prompt_once=False, prompt_delta=True) == whole


@pytest.mark.parametrize(("variant", "language"), GAMES)
async def test_rebuild_is_needed(env_client: EnvironmentClient, variant: str, language: str) -> None:
    """On the wire the prompts are fragments (so a client that did not rebuild them would differ), and
    the documented byte rule alone rebuilds them: what a client in another language does."""
    req = create(variant, language, 3)
    whole = [pb.Observation.FromString(d) for d in await play_raw(env_client, req)]
    delta = await play_raw(env_client, req, prompt_delta=True, omit_messages=True)
    wire = [pb.Observation.FromString(d) for d in delta]
    assert [o.text for o in rebuilt_by_bytes(delta)] == [o.text for o in whole]
    shared = [o for o in wire if o.text_shared_prefix_bytes]
    assert len(shared) > 0.8 * (len(wire) - int(variant.removesuffix("p")))  # all but each seat's first
    # each seat's first prompt goes whole (rules, role): 0.18-0.45 of the text in these games, shorter
    # games more; the decisions' bytes (messages not sent either) 0.10-0.24 of the plain stream's
    text_bytes = sum(len(o.text.encode()) for o in wire)
    assert text_bytes < 0.6 * sum(len(o.text.encode()) for o in whole)
    assert sum(o.ByteSize() for o in wire) < 0.3 * sum(o.ByteSize() for o in whole)


async def test_without_the_flag_nothing_changes(env_client: EnvironmentClient) -> None:
    req = create("6p", "en", 5)
    plain = [pb.Observation.FromString(d) for d in await play_raw(env_client, req)]
    assert all(o.text and not o.text_shared_prefix_bytes for o in plain)


def test_shared_prefix() -> None:
    rng = random.Random(0)
    alphabet = "ab\n狼人 é"
    for _ in range(3000):
        common = "".join(rng.choice(alphabet) for _ in range(rng.choice([0, 5, 600, 1500])))
        a = common + "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 700)))
        b = common + "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 700)))
        k = shared_prefix(a, b)
        assert a[:k] == b[:k]
        assert k == min(len(a), len(b)) or a[k] != b[k]
        assert k >= len(common)


def test_restore_prompts_rebuilds_and_rejects_what_does_not_fit() -> None:
    prompts: dict[tuple[str, int], str] = {}
    first = pb.Observation(episode_id="e", seat=1, text="狼人 night 1\nvote?")
    again = pb.Observation(
        episode_id="e", seat=1, text="day\nspeak?", text_shared_prefix_bytes=len("狼人 night 1\n".encode())
    )
    restore_prompts([first, again], prompts, messages=True)
    assert again.text == "狼人 night 1\nday\nspeak?" and not again.text_shared_prefix_bytes
    assert [(m.role, m.content) for m in again.messages] == [("user", again.text)]
    assert prompts == {("e", 1): again.text}
    final = pb.Observation(episode_id="e", seat=1, done=True, text="", text_shared_prefix_bytes=3)
    restore_prompts([final], prompts, messages=False)
    assert final.text == "狼" and not final.messages and not prompts  # the seat's state goes with its end
    for bad in (
        pb.Observation(episode_id="x", seat=0, text="a", text_shared_prefix_bytes=2),  # no previous prompt
        pb.Observation(episode_id="e", seat=2, text="a", text_shared_prefix_bytes=99),  # longer than it
        pb.Observation(episode_id="e", seat=2, text="a", text_shared_prefix_bytes=1),  # inside a character
    ):
        state = {("e", 2): "狼x"}
        with pytest.raises(PromptDeltaError):
            restore_prompts([bad], state, messages=False)


# --- omit_final_text -------------------------------------------------------------------------------


def without_final_prompt(raw: bytes) -> bytes:
    """A decision as a stream with ``omit_final_text`` should send it: a final observation loses its
    prompt (text, messages, delta count), every other decision is unchanged."""
    obs = pb.Observation.FromString(raw)
    if obs.done:
        for name in ("text", "messages", "text_shared_prefix_bytes"):
            obs.ClearField(name)
    return obs.SerializeToString(deterministic=True)


@pytest.mark.parametrize(("variant", "language"), [("6p", "en"), ("9p", "zh"), ("12p", "en")])
async def test_omit_final_text_drops_only_the_final_prompts(
    env_client: EnvironmentClient, variant: str, language: str
) -> None:
    """Every decision of whole games byte for byte: the finals without their prompt and nothing else
    changed, on a bare stream and through the client, alone and with the other prompt options."""
    players = int(variant.removesuffix("p"))
    req = create(variant, language, 1)
    whole = await play_raw(env_client, req)
    assert sum(pb.Observation.FromString(d).done for d in whole) == players
    assert all(pb.Observation.FromString(d).text for d in whole)  # finals carry their prompt by default
    expected = [without_final_prompt(d) for d in whole]
    assert expected != whole
    assert await play_raw(env_client, req, omit_final_text=True) == expected
    for options in ({}, {"prompt_once": False}, {"prompt_delta": True}):
        assert await play_client(env_client, req, final_text=False, **options) == expected, options
    assert await play_client(env_client, req) == whole  # the client's default asks for them


async def test_play_episodes_final_text(env_client: EnvironmentClient) -> None:
    reqs = [create("6p", "en", s) for s in range(3)]

    def decide(obs: pb.Observation) -> str:
        assert obs.text  # decisions keep their prompt either way
        return answer(obs, random.Random(obs.turn_id))

    for final_text in (True, False):
        finals = [
            done.finals
            async for done in env_client.play_episodes(reqs, decide, include_text=True, final_text=final_text)
        ]
        assert len(finals) == 3 and all(len(f) == 6 for f in finals)
        for f in finals:
            assert all(o.done and o.role and o.outcome for o in f.values())
            assert all(bool(o.text) == final_text for o in f.values())
