"""One serving pipeline for every generation API.

An API is two things: a translator, from its parsed request body
(:class:`~izh_trio.frontend.serving.intake.Intake`) to a
:class:`~izh_trio.frontend.serving.api.Job` (choice specs, model, adapter, priority, salt,
stream or not, and the :class:`~izh_trio.frontend.serving.api.Output` that says the answer
in the API's shapes), and that output. The pipeline
(:mod:`~izh_trio.frontend.serving.pipeline`) does the rest: reads the body, admits the
request, opens its generation, feeds the deltas to the output and answers, a JSON body or
server-sent events::

    bp = generation_route("chat", "/v1/chat/completions", ChatCompletionRequest, chat_job)
"""
