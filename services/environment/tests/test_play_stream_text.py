"""PlaySeats decisions carry the prompt once: ``text`` set, ``messages`` empty (it would only repeat
``text`` as the one user message). The unary paths keep ``messages``, which is exactly ``[user: text]``:
what a PlaySeats client (the rollout driver's prompt builder) builds from ``text`` when ``messages`` is
empty."""

from __future__ import annotations

import asyncio

from wolfpack.v1 import environment_service_pb2 as pb
from wolfpack_environment.client import EnvironmentClient, episode_request


async def test_playseats_decisions_send_text_once_and_unary_observations_keep_messages(
    env_client: EnvironmentClient,
) -> None:
    call = env_client.stub.PlaySeats(timeout=60)
    await call.write(
        pb.PlaySeatsRequest(
            include_text=True,
            create=[episode_request("werewolf_v1", "6p", seed=4, external_seats=tuple(range(6)))],
        )
    )
    decisions: list[pb.Observation] = []
    created: list[pb.CreatedEpisode] = []
    while not decisions:
        msg = await asyncio.wait_for(call.read(), 20)
        assert isinstance(msg, pb.PlaySeatsResponse)
        decisions.extend(msg.decisions)
        created.extend(msg.created)
    call.cancel()
    for obs in decisions:
        assert obs.text and not obs.messages
    first = decisions[0]
    token = next(t.token for t in created[0].episode.seat_tokens if t.seat == first.seat)
    unary = await env_client.seat(first.episode_id, token).observation()
    assert unary.text == first.text
    assert [(m.role, m.content) for m in unary.messages] == [("user", first.text)]
