"""HTTP answers counted by status class (``2xx`` ... ``5xx``), for the 5xx-rate alert: every
answer the app sends, counted when its status line goes out."""

from __future__ import annotations

from hypercorn.typing import ASGIReceiveCallable, ASGISendCallable, ASGISendEvent, Scope
from prometheus_client import Counter

from izh_trio.frontend.asgi import ASGIApp


def with_status_counts(asgi_app: ASGIApp, counter: Counter) -> ASGIApp:
    async def app(scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        if scope["type"] != "http":
            return await asgi_app(scope, receive, send)

        async def send_counting(message: ASGISendEvent) -> None:
            if message["type"] == "http.response.start":
                counter.labels(f"{message['status'] // 100}xx").inc()
            await send(message)

        return await asgi_app(scope, receive, send_counting)

    return app
