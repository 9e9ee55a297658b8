"""A ``POST /v1/messages`` body, parsed strictly by ``schemas.parse_body``.

Anthropic's fields, plus the sampling extensions every route of this server accepts (``seed``,
``min_p``, penalties, ``priority``, ``lora``, ``cache_salt``...). Structured fields
(``messages``, ``system``, ``tools``, ``tool_choice``, ``thinking``) stay raw and are checked
where they are translated, each error naming its field.
"""

from __future__ import annotations

from typing import Any, ClassVar

import attrs
from attrs import validators as v

from izh_trio.frontend.field_checks import only_one, refused
from izh_trio.frontend.schemas import SamplingFields


def _strings(_inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, list) or not all(isinstance(x, str) and x for x in value):
        raise TypeError(f"'{attr.name}' must be an array of non-empty strings")


def _metadata(_inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, dict) or set(value) - {"user_id"}:
        raise ValueError(f"'{attr.name}' may hold only 'user_id'")
    if value.get("user_id") is not None and not isinstance(value["user_id"], str):
        raise TypeError(f"'{attr.name}.user_id' must be a string")


# Not slotted: a class cannot have two bases with slots, and MessagesRequest has two.
@attrs.frozen(kw_only=True, slots=False)
class PromptFields:
    """What makes a Messages request's prompt: all of a ``count_tokens`` body but its model."""

    null_means_default: ClassVar[bool] = True

    messages: Any = attrs.field()  # checked by ``conversation``
    system: Any = None
    tools: Any = None  # checked by ``options``, as are tool_choice and thinking
    tool_choice: Any = None
    thinking: Any = None
    output_config: Any = None  # its format is a constraint: checked by ``options``
    chat_template_kwargs: Any = None


@attrs.frozen(kw_only=True)
class MessagesRequest(PromptFields, SamplingFields):
    max_tokens: int = attrs.field(validator=v.ge(1))
    stop_sequences: Any = attrs.field(default=None, validator=_strings)
    metadata: Any = attrs.field(default=None, validator=_metadata)
    # Accepted, and change nothing: the prefix cache caches every prompt (cache_control);
    # the rest name Anthropic's accounts, regions and service levels.
    cache_control: Any = None
    service_tier: str | None = None
    speed: str | None = None
    inference_geo: str | None = None
    diagnostics: Any = None
    user_profile_id: str | None = None
    workspace_id: str | None = None
    n: int = attrs.field(default=1, validator=only_one(
        "is not part of the Messages API: a request is answered by one message"))
    mcp_servers: Any = attrs.field(default=None, validator=refused(
        "this server connects to no MCP servers; give the tools in 'tools'"))
    container: Any = attrs.field(default=None, validator=refused(
        "this server runs no code execution containers"))

    @property
    def stops(self) -> tuple[str, ...]:
        """Anthropic's ``stop_sequences`` and this server's ``stop``, as one list."""
        return (*(self.stop_sequences or ()), *self.stop)


@attrs.frozen(kw_only=True)
class CountTokensRequest(PromptFields):
    """A ``POST /v1/messages/count_tokens`` body."""

    model: str | None = None
