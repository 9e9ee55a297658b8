"""A ``POST /v1/responses`` body, parsed strictly by ``schemas.parse_body``.

The sampling extensions chat and completions accept (``seed``, ``top_k``, ``stop``,
``priority``, ``lora``, ``cache_salt``...) are accepted here too; ``n`` is not: a response is
one generation. Structured fields (``input``, ``tools``, ``text``, ``reasoning``) stay raw and
are checked where they are translated, each error naming its field.
"""

from __future__ import annotations

from typing import Any

import attrs
from attrs import validators as v

from izh_trio.frontend.field_checks import only_one, refused
from izh_trio.frontend.schemas import SamplingFields

#: The ``include`` values a response can honour. ``reasoning.encrypted_content`` asks for
#: reasoning a stateless client can send back: this server sends reasoning as plain text,
#: which it reads back as well, so there is nothing to encrypt. The others name outputs of
#: built-in tools and inputs this server never has, so asking for them changes nothing.
INCLUDES = ("message.output_text.logprobs", "reasoning.encrypted_content",
            "message.input_image.image_url", "computer_call_output.output.image_url",
            "file_search_call.results", "web_search_call.results",
            "web_search_call.action.sources", "code_interpreter_call.outputs")


def _includes(_inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise TypeError(f"'{attr.name}' must be an array of strings")
    for name in value:
        if name not in INCLUDES:
            raise ValueError(f"'{attr.name}' has {name!r}, which is not one of "
                             f"{', '.join(INCLUDES)}")


def _metadata(_inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    """OpenAI's bounds: 16 pairs, keys of 64 characters, values of 512."""
    if value is None:
        return
    if not isinstance(value, dict) or not all(isinstance(x, str) for x in value.values()):
        raise TypeError(f"'{attr.name}' must be an object whose values are strings")
    if len(value) > 16 or any(len(k) > 64 or len(x) > 512 for k, x in value.items()):
        raise ValueError(f"'{attr.name}' holds at most 16 pairs, keys of at most 64 characters "
                         "and values of at most 512")


@attrs.frozen(kw_only=True)
class ResponsesRequest(SamplingFields):
    input: Any = None  # a string or a list of items: checked by ``items``
    instructions: str | None = None
    tools: Any = None  # checked by ``options``, as are tool_choice, text and reasoning
    tool_choice: Any = None
    parallel_tool_calls: bool = True
    text: Any = None
    reasoning: Any = None
    max_output_tokens: int | None = attrs.field(default=None, validator=v.optional(v.ge(1)))
    max_tool_calls: int | None = attrs.field(default=None, validator=v.optional(v.ge(0)))
    top_logprobs: int | None = attrs.field(default=None, validator=v.optional([v.ge(0),
                                                                               v.le(20)]))
    include: Any = attrs.field(default=None, validator=_includes)
    truncation: str = attrs.field(default="disabled", validator=v.in_(("disabled", "auto")))
    metadata: Any = attrs.field(default=None, validator=_metadata)
    store: bool = True
    chat_template_kwargs: Any = None
    # Informational: checked, then unused.
    service_tier: str | None = None
    safety_identifier: str | None = None
    prompt_cache_retention: str | None = None
    n: int = attrs.field(default=1, validator=only_one(
        "is not part of the Responses API: a response is one generation"))
    previous_response_id: str | None = None
    background: bool = False
    conversation: Any = attrs.field(default=None, validator=refused(
        "conversations are not implemented; send the items in 'input'"))
    prompt: Any = attrs.field(default=None, validator=refused(
        "prompt templates are not implemented; send 'instructions' and 'input'"))

    @property
    def logprobs(self) -> int | None:
        """The top logprobs per token that the response carries; None: no logprobs."""
        if "message.output_text.logprobs" not in (self.include or ()):
            return None
        return self.top_logprobs or 0
