"""One exit stack per HTTP request, open from the ASGI call's start to its very end.

A streamed response's body runs after its route has returned, and quart opens the body only after
the status line went out. A generation opened inside the body therefore reaches the engine core
late: on trio every request of a burst passes each await of quart's response path before any of them
opens its body, so a burst's first AddRequest would wait for the whole burst. Opened in the route,
it is queued as soon as the route has parsed the request, and a wave reaches the core sooner
(``tools/bench/results/frontend.md``). The engine requests must still be aborted however the HTTP
request ends, including a client gone before quart opened the body (which then never runs at all),
so the generation is entered into this stack, which the ASGI wrapper closes when the request's ASGI
call ends for any reason: finished, failed, disconnected or cancelled. The request's admission
ticket is returned from the same stack, just after the generation closes.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from contextvars import ContextVar
from typing import TypeVar

from hypercorn.typing import ASGIReceiveCallable, ASGISendCallable, Scope

from izh_trio.frontend.asgi import ASGIApp

T = TypeVar("T")

_STACK: ContextVar[AsyncExitStack | None] = ContextVar("izh_request_scope", default=None)


def with_request_scope(asgi_app: ASGIApp) -> ASGIApp:
    """Wrap an ASGI app so that every HTTP request runs inside its own exit stack. trio copies
    the context into the tasks quart-trio starts for the request, so its route sees it."""

    async def app(scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        if scope["type"] != "http":
            return await asgi_app(scope, receive, send)
        async with AsyncExitStack() as stack:
            token = _STACK.set(stack)
            try:
                return await asgi_app(scope, receive, send)
            finally:
                _STACK.reset(token)

    return app


def _stack() -> AsyncExitStack:
    stack = _STACK.get()
    if stack is None:
        raise RuntimeError("no request scope: the ASGI app is not wrapped by with_request_scope")
    return stack


async def enter(cm: AbstractAsyncContextManager[T]) -> T:
    """Enter ``cm`` for the rest of the current HTTP request (it exits when the request's
    ASGI call ends)."""
    return await _stack().enter_async_context(cm)


def at_exit(callback: Callable[[], object]) -> None:
    """Call ``callback`` when the current HTTP request's ASGI call ends (after whatever was
    entered later has exited)."""
    _stack().callback(callback)
