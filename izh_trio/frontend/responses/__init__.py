"""OpenAI's Responses API (``POST /v1/responses``) on the serving pipeline: a request
translator (``request``, ``items``, ``options``, ``translate``) and an ``Output``
(``output_items``, ``output``); ``route`` is its blueprint."""
