"""httpx transports that note what the server answered to each chat completion.

Some clients hide the finish reason (the Agents SDK, LlamaIndex's structured_predict), and a
lenient parser can make a cut-off call look whole. These pass each body through untouched
and, once it has been read, note its finish reason, content and calls in ``ANSWERS``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx

ANSWERS: list[dict[str, Any]] = []


def _answer(body: bytes, status: int, streamed: bool) -> dict[str, Any]:
    if status != 200:
        return {"status": status, "body": body.decode(errors="replace")}
    if not streamed:
        choice = json.loads(body)["choices"][0]
        return {"finish": choice["finish_reason"], "content": choice["message"]["content"],
                "tool_calls": [(c["function"]["name"], c["function"]["arguments"])
                               for c in choice["message"].get("tool_calls") or []]}
    finish, text, calls = None, [], {}
    for line in body.decode().splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        for choice in json.loads(line[6:]).get("choices") or []:
            finish = choice.get("finish_reason") or finish
            text.append(choice["delta"].get("content") or "")
            for d in choice["delta"].get("tool_calls") or []:
                name, args = calls.get(d["index"], ("", ""))
                fn = d.get("function") or {}
                calls[d["index"]] = (name + (fn.get("name") or ""),
                                     args + (fn.get("arguments") or ""))
    return {"finish": finish, "content": "".join(text), "tool_calls": list(calls.values()),
            "streamed": True}


class _Body:
    def __init__(self, inner: Any, response: httpx.Response) -> None:
        self.inner, self.status = inner, response.status_code
        self.streamed = "event-stream" in response.headers.get("content-type", "")
        self.body = bytearray()
        self.noted = False

    def note(self) -> None:
        # At the end of the body, or at its close: a client may stop reading at [DONE].
        if not self.noted:
            self.noted = True
            ANSWERS.append(_answer(bytes(self.body), self.status, self.streamed))


class _SyncBody(_Body, httpx.SyncByteStream):
    def __iter__(self) -> Iterator[bytes]:
        for chunk in self.inner:
            self.body += chunk
            yield chunk
        self.note()

    def close(self) -> None:
        self.note()
        self.inner.close()


class _AsyncBody(_Body, httpx.AsyncByteStream):
    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.inner:
            self.body += chunk
            yield chunk
        self.note()

    async def aclose(self) -> None:
        self.note()
        await self.inner.aclose()


def _wrap(request: httpx.Request, response: httpx.Response, body: type[_Body]) -> httpx.Response:
    if not request.url.path.endswith("/chat/completions"):
        return response
    return httpx.Response(response.status_code, headers=response.headers,
                          extensions=response.extensions, stream=body(response.stream, response))


class Transport(httpx.BaseTransport):
    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        return _wrap(request, self.inner.handle_request(request), _SyncBody)

    def close(self) -> None:
        self.inner.close()


class AsyncTransport(httpx.AsyncBaseTransport):
    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return _wrap(request, await self.inner.handle_async_request(request), _AsyncBody)

    async def aclose(self) -> None:
        await self.inner.aclose()
