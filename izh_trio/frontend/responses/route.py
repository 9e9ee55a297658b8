"""``POST /v1/responses`` (the serving pipeline, with the Responses translator and output) and
the routes of stored responses (``retrieve``)."""

from __future__ import annotations

from izh_trio.frontend.responses.request import ResponsesRequest
from izh_trio.frontend.responses.retrieve import add_routes
from izh_trio.frontend.responses.translate import responses_job
from izh_trio.frontend.serving.pipeline import generation_route

bp = generation_route("responses", "/v1/responses", ResponsesRequest, responses_job)
add_routes(bp)
