"""Blocking work handed to threads of their own: ``off_loop`` while the event loop keeps serving (the
trainer's loop: TrainerService, health checks, the stream's consumer), used by the trainer for updates,
checkpoints and evaluations and by the publisher for writing a version's directory; ``side_by_side`` for
several learners' work at once (``train.parallel_learners``).

Worker threads are named ``trainer:<function>``: ``train._exit_before_finalizing`` looks for them at exit."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")
A = TypeVar("A")


async def off_loop(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a worker thread while the event loop keeps serving (TrainerService, health checks).

    A daemon thread of its own rather than ``asyncio.to_thread``: the default executor's threads are
    joined when the loop and the interpreter shut down, so a second Ctrl-C would wait for the update to
    finish instead of quitting at once."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()
    context = contextvars.copy_context()

    def settle(result: Any, exc: BaseException | None) -> None:
        if done.done():
            return  # the awaiting task was cancelled (shutdown)
        if exc is not None:
            done.set_exception(exc)
        else:
            done.set_result(result)

    def work() -> None:
        try:
            result, exc = context.run(fn, *args), None
        except BaseException as e:  # handed to the awaiting task, raised there
            result, exc = None, e
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile (second Ctrl-C)
            loop.call_soon_threadsafe(settle, result, exc)

    threading.Thread(target=work, name=f"trainer:{getattr(fn, '__name__', 'work')}", daemon=True).start()
    return await done


def side_by_side(fn: Callable[[A], T], items: Sequence[A], names: Sequence[str]) -> list[T]:
    """``fn`` of every item at once, one thread each (``trainer:<name>``), results in the items' order; the
    first failure is raised once every thread has ended. Daemon threads as ``off_loop``'s, not a pool: the
    interpreter joins a pool's threads at exit, so a second Ctrl-C would wait for the work."""
    results: list[Any] = [None] * len(items)
    errors: list[BaseException | None] = [None] * len(items)

    def work(i: int, context: contextvars.Context) -> None:
        try:
            results[i] = context.run(fn, items[i])
        except BaseException as exc:  # raised below, in the caller's thread
            errors[i] = exc

    threads = [
        threading.Thread(
            target=work, args=(i, contextvars.copy_context()), name=f"trainer:{name}", daemon=True
        )
        for i, name in enumerate(names)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for exc in errors:
        if exc is not None:
            raise exc
    return results
