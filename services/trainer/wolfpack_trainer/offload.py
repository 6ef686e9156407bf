"""Blocking work handed to a thread of its own while the event loop keeps serving (the trainer's loop:
TrainerService, health checks, the stream's consumer). Used by the trainer for updates, checkpoints and
evaluations, and by the publisher for writing a version's directory.

Worker threads are named ``trainer:<function>``: ``train._exit_before_finalizing`` looks for them at exit."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


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
