"""``POST /v1/messages`` (the serving pipeline, with the Messages translator and output) and
``POST /v1/messages/count_tokens``."""

from __future__ import annotations

from izh_trio.frontend.messages.request import MessagesRequest
from izh_trio.frontend.messages.translate import add_count_tokens, messages_job
from izh_trio.frontend.serving.pipeline import generation_route

bp = generation_route("messages", "/v1/messages", MessagesRequest, messages_job)
add_count_tokens(bp)
