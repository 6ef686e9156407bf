"""Typed asyncio client of the environment service, for our rollout workers and for external agents.

``EnvironmentClient`` mirrors the RPCs with plain Python types; ``SeatSession`` is one seat of one
episode (episode id + secret token) with ``play(decide)``, the loop an agent needs: wait for its turn,
ask ``decide(observation)`` for text or an ``Action``, send it, repeat until the game ends. Re-prompts
after invalid output arrive as a new observation with ``feedback`` set.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import grpc

from wolfpack import rpc
from wolfpack.errors import code_of
from wolfpack.settings import Settings, load_settings
from wolfpack.v1 import common_pb2
from wolfpack.v1 import environment_service_pb2 as pb
from wolfpack.v1 import environment_service_pb2_grpc as pb_grpc

Decision = str | common_pb2.Action
_DECISION_TYPES = (str, common_pb2.Action)
"""``Decision``'s types, for ``isinstance``."""
Decider = Callable[[pb.Observation], Awaitable[Decision] | Decision]


@dataclass(frozen=True)
class CreatedEpisode:
    episode_id: str
    admin_token: str
    seat_tokens: dict[int, str]
    num_seats: int

    @classmethod
    def from_pb(cls, resp: pb.CreateEpisodeResponse) -> CreatedEpisode:
        return cls(
            resp.episode_id, resp.admin_token, {t.seat: t.token for t in resp.seat_tokens}, resp.num_seats
        )


@dataclass(frozen=True)
class FinishedEpisode:
    """An episode played to its end by ``play_episodes``: its ids/tokens and each seat's final observation."""

    episode: CreatedEpisode
    finals: dict[int, pb.Observation]


def episode_request(
    game_id: str,
    variant: str = "",
    seed: int = 0,
    *,
    external_seats: tuple[int, ...] = (),
    policy_seats: Mapping[int, str] | None = None,
    bots: Mapping[int, str] | None = None,
    default_bot: str = "",
    language: str = "en",
    turn_timeout_s: float = 0.0,
    options: Mapping[str, str] | None = None,
    request_id: str = "",
) -> pb.CreateEpisodeRequest:
    """A ``CreateEpisodeRequest`` from plain arguments (for ``create_episode`` and ``play_episodes``)."""
    req = pb.CreateEpisodeRequest(
        game=common_pb2.GameRef(game_id=game_id, variant=variant),
        seed=seed,
        default_bot=default_bot,
        language=language,
        turn_timeout_s=turn_timeout_s,
        options=dict(options or {}),
        request_id=request_id,
    )
    for seat in external_seats:
        req.seats.add(seat=seat, controller=common_pb2.SEAT_CONTROLLER_EXTERNAL)
    for seat, policy_id in (policy_seats or {}).items():
        b = req.seats.add(seat=seat, controller=common_pb2.SEAT_CONTROLLER_POLICY)
        b.policy.policy_id = policy_id
    for seat, bot in (bots or {}).items():
        req.seats.add(seat=seat, controller=common_pb2.SEAT_CONTROLLER_SCRIPTED, bot=bot)
    return req


class EnvironmentClient:
    """Connects to ``target`` (host:port); use ``async with EnvironmentClient(...) as env``."""

    def __init__(self, target: str, settings: Settings | None = None) -> None:
        self.settings = settings or load_settings()
        self.channel = rpc.channel(target, self.settings)
        self.stub = pb_grpc.EnvironmentServiceStub(self.channel)

    async def __aenter__(self) -> EnvironmentClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self.channel.close()

    async def list_games(self) -> list[pb.GameInfo]:
        return list((await self.stub.ListGames(pb.ListGamesRequest())).games)

    async def create_episode(
        self,
        game_id: str,
        variant: str = "",
        seed: int = 0,
        *,
        external_seats: tuple[int, ...] = (),
        policy_seats: Mapping[int, str] | None = None,
        bots: Mapping[int, str] | None = None,
        default_bot: str = "",
        language: str = "en",
        turn_timeout_s: float = 0.0,
        options: Mapping[str, str] | None = None,
        request_id: str = "",
    ) -> CreatedEpisode:
        req = episode_request(
            game_id, variant, seed, external_seats=external_seats, policy_seats=policy_seats, bots=bots,
            default_bot=default_bot, language=language, turn_timeout_s=turn_timeout_s, options=options,
            request_id=request_id,
        )  # fmt: skip
        return CreatedEpisode.from_pb(await self.stub.CreateEpisode(req))

    def seat(self, episode_id: str, token: str) -> SeatSession:
        return SeatSession(self, episode_id, token)

    def play_stream(
        self,
        *,
        include_text: bool = True,
        close_finished: bool = False,
        rejected_results_only: bool = False,
        prompt_once: bool = True,
        prompt_delta: bool = False,
        final_text: bool = True,
    ) -> PlayStream:
        """A new ``PlaySeats`` call at the message level (``PlayStream``: create/join/act, ``read``); close
        it with ``await stream.close()``. Streams get no default deadline: one lasts as long as its games.
        ``prompt_once`` and ``prompt_delta`` (see ``PlayStream``) change the bytes on the wire, not what
        ``read`` returns; ``final_text=False`` leaves the prompt out of final observations."""
        return PlayStream(
            self.stub,
            include_text=include_text,
            close_finished=close_finished,
            rejected_results_only=rejected_results_only,
            prompt_once=prompt_once,
            prompt_delta=prompt_delta,
            final_text=final_text,
        )

    async def play_seats(
        self,
        seats: Sequence[tuple[str, int, str]],
        decide: Decider,
        include_text: bool = True,
    ) -> dict[tuple[str, int], pb.Observation]:
        """Play many seats ``(episode_id, seat, token)`` of many episodes over one ``PlaySeats`` stream
        until every one of them is done; returns each seat's final observation. Decisions arrive in
        batches and the answers go back batched, which is what makes this path fast. ``decide`` may be
        async: slow decisions don't hold up the others. Request errors for an act (e.g. a stale turn) are
        not fatal: the server sends the seat's next decision when there is one."""
        async with _PlayCall(self.stub, decide, include_text, close_finished=False) as play:
            for episode_id, seat, token in seats:
                play.join(episode_id, seat, token)
            final: dict[tuple[str, int], pb.Observation] = {}
            wanted = len(play.tokens)
            while len(final) < wanted:
                for _ep, finals in await play.next_finished():
                    final.update(((obs.episode_id, obs.seat), obs) for obs in finals.values())
            return final

    async def play_episodes(
        self,
        requests: Iterable[pb.CreateEpisodeRequest],
        decide: Decider,
        *,
        concurrency: int = 64,
        include_text: bool = False,
        close_finished: bool = True,
        prompt_once: bool = True,
        prompt_delta: bool = False,
        final_text: bool = True,
    ) -> AsyncIterator[FinishedEpisode]:
        """Create and play episodes over one ``PlaySeats`` stream, ``concurrency`` at a time, and yield
        each as it ends. Every non-scripted seat is played with ``decide``; a new episode is created as
        soon as one ends, so the server always has ``concurrency`` games to step. This is the rollout
        worker's loop (``requests`` may be an endless generator). With ``close_finished`` the server
        releases each episode once its end was sent (read its log with ``include_text`` observations, not
        GetEpisode). ``prompt_once``, ``prompt_delta``: see ``PlayStream`` (what ``decide`` sees is the same
        either way). ``final_text=False``: the finals carry no prompt (``PlayStream``), for callers that
        only want each seat's outcome and role."""
        source = iter(requests)
        async with _PlayCall(
            self.stub, decide, include_text, close_finished, prompt_once, prompt_delta, final_text
        ) as play:
            live = 0
            for req in itertools.islice(source, concurrency):
                play.create(req)
                live += 1
            while live:
                for episode, finals in await play.next_finished():
                    live -= 1
                    yield FinishedEpisode(episode, finals)
                    for req in itertools.islice(source, 1):
                        play.create(req)
                        live += 1

    async def get_episode(self, episode_id: str, token: str) -> pb.GetEpisodeResponse:
        return await self.stub.GetEpisode(pb.GetEpisodeRequest(episode_id=episode_id, token=token))

    async def close_episode(self, episode_id: str, admin_token: str) -> bool:
        resp = await self.stub.CloseEpisode(pb.CloseEpisodeRequest(episode_id=episode_id, token=admin_token))
        return resp.closed

    async def list_episodes(
        self, page_size: int = 0, page_token: str = "", status: int = pb.EPISODE_STATUS_UNSPECIFIED
    ) -> pb.ListEpisodesResponse:
        """One page of the server's episodes, newest first (needs the service credential: this client's
        channel attaches the configured ``WOLFPACK_ADMIN_SECRET``)."""
        req = pb.ListEpisodesRequest(page_size=page_size, page_token=page_token, status=status)  # type: ignore[arg-type]
        return await self.stub.ListEpisodes(req)

    async def all_episodes(
        self, status: int = pb.EPISODE_STATUS_UNSPECIFIED, limit: int = 1_000
    ) -> list[pb.EpisodeSummary]:
        """Every episode, page after page, up to ``limit`` (the server holds up to 20,000)."""
        out: list[pb.EpisodeSummary] = []
        token = ""
        while len(out) < limit:
            resp = await self.list_episodes(min(200, limit - len(out)), token, status)
            out.extend(resp.episodes)
            token = resp.next_page_token
            if not token:
                break
        return out

    async def spectate(self, episode_id: str) -> pb.GetEpisodeResponse:
        """The full view of any episode, running or over, by id (needs the service credential; no token)."""
        resp = await self.stub.SpectateEpisode(pb.SpectateEpisodeRequest(episode_id=episode_id))
        return resp.episode


def restore_messages(decisions: Iterable[pb.Observation]) -> None:
    """Fill ``Observation.messages`` of decisions a server sent without them (``omit_messages``) exactly
    as the server fills them otherwise: one user message whose content is the text
    (``wolfpack_games.session_proto.Observations.observation``; ``tests`` compare both byte for byte).
    A decision that has messages is left alone: a server that predates ``omit_messages`` ignores it and
    sends them, and they must not be doubled. One without text (a final observation under
    ``omit_final_text``) gets none, as the server sends none when it renders no text."""
    for obs in decisions:
        messages = obs.messages
        if not messages:
            text = obs.text
            if text:
                # ``add()`` then the fields: upb's keyword constructor path costs ~3x as much per decision
                message = messages.add()
                message.role = "user"
                message.content = text


class PromptDeltaError(ValueError):
    """A decision's ``text_shared_prefix_bytes`` does not fit the seat's previous prompt (a server bug or
    a stream read by two consumers): the prompt cannot be rebuilt."""


def restore_prompts(
    decisions: Iterable[pb.Observation], prompts: dict[tuple[str, int], str], messages: bool
) -> None:
    """Rebuild each decision's whole prompt in ``Observation.text`` from a stream with
    ``PlaySeatsRequest.prompt_delta``: the previous prompt of the same episode and seat (kept in
    ``prompts``, updated here; a seat's entry is dropped at its final observation) cut to
    ``text_shared_prefix_bytes`` UTF-8 bytes, followed by ``text``. The field is cleared, so the decision
    reads exactly as one sent whole. With ``messages`` (``omit_messages`` was asked for) also fills
    ``Observation.messages`` as ``restore_messages`` does, from the rebuilt text."""
    for obs in decisions:
        key = (obs.episode_id, obs.seat)
        shared = obs.text_shared_prefix_bytes
        if shared:
            prev = prompts.get(key)
            if prev is None:
                raise PromptDeltaError(f"{key}: {shared} shared bytes, but no previous prompt on this stream")
            if prev.isascii():
                if shared > len(prev):
                    raise PromptDeltaError(f"{key}: {shared} shared bytes of a {len(prev)}-byte prompt")
                text = prev[:shared] + obs.text
            else:
                raw = prev.encode("utf-8")
                if shared > len(raw):
                    raise PromptDeltaError(f"{key}: {shared} shared bytes of a {len(raw)}-byte prompt")
                try:
                    text = raw[:shared].decode("utf-8") + obs.text
                except UnicodeDecodeError:
                    raise PromptDeltaError(f"{key}: {shared} bytes is not a character boundary") from None
            obs.text = text
            obs.ClearField("text_shared_prefix_bytes")
        else:
            text = obs.text
        if obs.done:
            prompts.pop(key, None)
        else:
            prompts[key] = text
        if messages and text and not obs.messages:
            message = obs.messages.add()
            message.role = "user"
            message.content = text


def wire_text(text: str) -> str:
    """``text`` as a proto string can carry it: lone surrogates (a decoder's ``surrogateescape`` output,
    never valid UTF-8) become U+FFFD. Without this an answer with one fails to serialise before it is
    sent, and the episode is lost instead of the game judging the answer as a move."""
    if text.isascii():  # O(1) for str, and most answers are: no encoding pass to find out
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")
    return text


class SeatSession:
    """One seat of one episode."""

    def __init__(self, client: EnvironmentClient, episode_id: str, token: str) -> None:
        self.client = client
        self.episode_id = episode_id
        self.token = token

    async def observation(self) -> pb.Observation:
        req = pb.GetObservationRequest(episode_id=self.episode_id, token=self.token)
        return (await self.client.stub.GetObservation(req)).observation

    async def observe(self) -> AsyncIterator[pb.Observation]:
        """Observations pushed by the server until the episode ends (no deadline: it lasts a game)."""
        call = self.client.stub.Observe(pb.ObserveRequest(episode_id=self.episode_id, token=self.token))
        async for resp in call:
            yield resp.observation

    async def act(self, turn_id: int, decision: Decision) -> pb.ActResponse:
        req = pb.ActRequest(episode_id=self.episode_id, token=self.token, turn_id=turn_id)
        if isinstance(decision, str):
            req.raw_text = wire_text(decision)
        else:
            req.action.CopyFrom(decision)
        return await self.client.stub.Act(req)

    async def play(self, decide: Decider) -> pb.Observation:
        """Play this seat to the end of the episode; returns the final observation."""
        last: pb.Observation | None = None
        async for obs in self.observe():
            last = obs
            while obs.your_turn and not obs.done:
                decision = decide(obs)
                if isinstance(decision, Awaitable):
                    decision = await decision
                try:
                    resp = await self.act(obs.turn_id, decision)
                except grpc.aio.AioRpcError as exc:
                    if exc.code() == grpc.StatusCode.FAILED_PRECONDITION:
                        break  # the turn moved on (timeout default); wait for the next observation
                    raise
                obs = resp.observation
                last = obs
                if resp.accepted or resp.defaulted:
                    break
        assert last is not None
        return last if last.done else await self.observation()


class PlayStream:
    """One ``PlaySeats`` call, client side, at the message level: everything to send (creates, joins,
    acts) goes to one outbox that a writer task flushes as one message whenever it is not empty, so
    answers are batched whatever mix of fast and slow deciders produced them; ``read`` returns the
    server's next message. The one PlaySeats client: ``play_seats``/``play_episodes`` (answers from a
    ``decide`` function) and the rollout driver (answers from inference) both play through it. The
    options go out with the first message.

    ``prompt_once`` (with ``include_text``): the server sends each prompt once, as ``Observation.text``
    (``PlaySeatsRequest.omit_messages``), and ``read`` rebuilds ``Observation.messages`` from it
    (``restore_messages``), so callers that pass ``obs.messages`` on to GenerateBatch see the same
    observations as without it, while a 2.5k-character prompt is no longer serialised, sent and parsed
    twice per decision.

    ``prompt_delta`` (with ``include_text``; off by default): the server sends each prompt as what is new
    since the seat's previous prompt on this stream (``PlaySeatsRequest.prompt_delta``) and ``read``
    rebuilds the whole text (``restore_prompts``): a seat's prompts grow by appending, so most of each one
    is already here. It takes the decisions' bytes to 0.10-0.24 of a plain stream's, for links where bytes
    cost; over loopback it costs more CPU than it saves (finding and rebuilding the shared part in Python:
    ``bench/results/2026-11-27-env-service-cpu-2.md``), hence off. ``read`` must see every message of the
    stream, in order (it keeps each live seat's last prompt).

    ``final_text=False`` (with ``include_text``): final observations (``done``) come without their prompt
    (``PlaySeatsRequest.omit_final_text``): a seat's final prompt is its longest, and the server renders it
    only to be sent; callers that read outcome and role (the rollout driver) skip it. A server that
    predates the field sends it anyway."""

    def __init__(
        self,
        stub: pb_grpc.EnvironmentServiceAsyncStub,
        *,
        include_text: bool = True,
        close_finished: bool = False,
        rejected_results_only: bool = False,
        prompt_once: bool = True,
        prompt_delta: bool = False,
        final_text: bool = True,
    ) -> None:
        self.call = stub.PlaySeats()
        self.restore = include_text and prompt_once
        self.delta = include_text and prompt_delta
        self.prompts: dict[tuple[str, int], str] = {}
        """With ``prompt_delta``: each live seat's last prompt (``restore_prompts``)."""
        self.outbox = pb.PlaySeatsRequest(
            include_text=include_text,
            close_finished=close_finished,
            rejected_results_only=rejected_results_only,
            omit_messages=self.restore,
            prompt_delta=self.delta,
            omit_final_text=include_text and not final_text,
        )
        self.mail = asyncio.Event()
        self.mail.set()  # the first message goes out even when empty (it carries the stream options)
        self.failure: BaseException | None = None
        """Why writing failed (the next ``read`` raises it)."""
        self.writer = asyncio.create_task(self._write_loop())

    def create(self, req: pb.CreateEpisodeRequest) -> None:
        self.outbox.create.append(req)
        self.mail.set()

    def join(self, episode_id: str, token: str) -> None:
        self.outbox.join.add(episode_id=episode_id, token=token)
        self.mail.set()

    def act(self, episode_id: str, token: str, turn_id: int, decision: Decision) -> None:
        act = self.outbox.acts.add()  # then the fields: cheaper than upb's keyword constructor
        act.episode_id = episode_id
        act.token = token
        act.turn_id = turn_id
        if isinstance(decision, str):
            # ``wire_text``'s ASCII test here: most answers are ASCII, and a call per act is not free
            act.raw_text = decision if decision.isascii() else wire_text(decision)
        else:
            act.action.CopyFrom(decision)
        self.mail.set()

    async def read(self) -> pb.PlaySeatsResponse:
        """The server's next message; raises the writer's failure, or ``ConnectionError`` at the stream's
        end (the server never ends a call whose client is still writing)."""
        try:
            message = await self.call.read()
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if self.failure is not None and task is not None and not task.cancelling():
                raise self.failure from None  # the writer failed and cancelled the call: say why
            raise
        if self.failure is not None:
            raise self.failure
        if message is grpc.aio.EOF:
            raise ConnectionError("the PlaySeats stream ended")
        assert isinstance(message, pb.PlaySeatsResponse)
        if self.delta:
            restore_prompts(message.decisions, self.prompts, self.restore)
        elif self.restore:
            restore_messages(message.decisions)
        return message

    async def close(self) -> None:
        self.writer.cancel()
        self.call.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self.writer

    async def _write_loop(self) -> None:
        try:
            while True:
                await self.mail.wait()
                self.mail.clear()
                message, self.outbox = self.outbox, pb.PlaySeatsRequest()
                await self.call.write(message)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # the read side reports it: the call is cancelled so a read wakes up
            self.failure = exc
            self.call.cancel()


@dataclass
class _Episode:
    created: CreatedEpisode
    finals: dict[int, pb.Observation] = field(default_factory=dict)


class _PlayCall:
    """``play_seats``/``play_episodes`` over one ``PlayStream``: the caller's task reads server messages
    (``next_finished``) and answers synchronous decisions at once; async decisions run as tasks."""

    def __init__(self, stub: pb_grpc.EnvironmentServiceAsyncStub, decide: Decider, include_text: bool,
                 close_finished: bool, prompt_once: bool = True, prompt_delta: bool = False,
                 final_text: bool = True) -> None:  # fmt: skip
        self.stub = stub
        self.options = {
            "include_text": include_text,
            "close_finished": close_finished,
            "prompt_once": prompt_once,
            "prompt_delta": prompt_delta,
            "final_text": final_text,
        }
        self.decide = decide
        self.tokens: dict[tuple[str, int], str] = {}
        self.episodes: dict[str, _Episode] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        self.failure: BaseException | None = None
        self.stream: PlayStream | None = None

    async def __aenter__(self) -> _PlayCall:
        self.stream = PlayStream(self.stub, rejected_results_only=True, **self.options)
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in self.tasks:
            task.cancel()
        if self.stream is not None:
            await self.stream.close()

    def create(self, req: pb.CreateEpisodeRequest) -> None:
        assert self.stream is not None
        self.stream.create(req)

    def join(self, episode_id: str, seat: int, token: str) -> None:
        assert self.stream is not None
        self.tokens[(episode_id, seat)] = token
        if episode_id not in self.episodes:
            self.episodes[episode_id] = _Episode(CreatedEpisode(episode_id, "", {}, 0))
        self.episodes[episode_id].created.seat_tokens[seat] = token
        self.stream.join(episode_id, token)

    def _answer(self, obs: pb.Observation, decision: Decision) -> None:
        assert self.stream is not None
        self.stream.act(obs.episode_id, self.tokens[(obs.episode_id, obs.seat)], obs.turn_id, decision)

    async def _answer_later(self, obs: pb.Observation, pending: Awaitable[Decision]) -> None:
        try:
            self._answer(obs, await pending)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            self.failure = exc

    async def next_finished(self) -> list[tuple[CreatedEpisode, dict[int, pb.Observation]]]:
        """Read server messages, answering decisions, until at least one episode has ended."""
        assert self.stream is not None
        ended: list[tuple[CreatedEpisode, dict[int, pb.Observation]]] = []
        while not ended:
            try:
                message = await self.stream.read()
            except ConnectionError:
                raise ConnectionError("the PlaySeats stream ended before the episodes did") from None
            if self.failure is not None:
                raise self.failure
            for created in message.created:
                if created.HasField("error"):
                    code = code_of(created.error).name
                    raise ValueError(f"creating an episode failed: {code}: {created.error.message}")
                episode = CreatedEpisode.from_pb(created.episode)
                self.episodes[episode.episode_id] = _Episode(episode)
                for seat, token in episode.seat_tokens.items():
                    self.tokens[(episode.episode_id, seat)] = token
                if not episode.seat_tokens:  # every seat scripted: it ended inside CreateEpisode
                    ended.append((self.episodes.pop(episode.episode_id).created, {}))
            # per decision: each proto field read once (every read of a string field builds a new str)
            episodes, tokens, decide, act = self.episodes, self.tokens, self.decide, self.stream.act
            for obs in message.decisions:
                episode_id = obs.episode_id
                state = episodes.get(episode_id)
                if state is None:
                    continue
                if obs.done:
                    state.finals[obs.seat] = obs
                    if len(state.finals) == len(state.created.seat_tokens):
                        del episodes[episode_id]
                        for seat in state.finals:
                            tokens.pop((episode_id, seat), None)
                        ended.append((state.created, state.finals))
                    continue
                turn_id = obs.turn_id
                if turn_id and obs.your_turn:
                    decision = decide(obs)
                    if isinstance(decision, _DECISION_TYPES):  # the common, synchronous case: no ABC check
                        act(episode_id, tokens[(episode_id, obs.seat)], turn_id, decision)
                    elif inspect.isawaitable(decision):
                        task = asyncio.ensure_future(self._answer_later(obs, decision))
                        self.tasks.add(task)
                        task.add_done_callback(self.tasks.discard)
                    else:
                        self._answer(obs, decision)
            for result in message.results:
                # A seat this stream doesn't hold is a caller error; a stale turn is not (the next
                # decision follows), nor is an episode that ended in between.
                lost = (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.NOT_FOUND)
                if code_of(result.error) in lost and result.episode_id in self.episodes:
                    raise LookupError(f"{result.episode_id}: {result.error.message}")
        return ended
