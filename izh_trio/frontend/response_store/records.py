"""What the store keeps: one frozen record per response, with its lifecycle checked."""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from izh_trio.frontend.response_store.errors import InvalidTransition

JSON = dict[str, Any]


class ResponseStatus(enum.Enum):
    """A response's ``status``, as OpenAI's response object names it."""

    QUEUED = "queued"
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    INCOMPLETE = "incomplete"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def final(self) -> bool:
        return self not in _NEXT

    def may_become(self, new: ResponseStatus) -> bool:
        return new in _NEXT.get(self, ())

    def predecessors(self) -> tuple[ResponseStatus, ...]:
        """The statuses a stored record may hold for a write of this one to replace it."""
        return tuple(s for s in ResponseStatus if s.may_become(self))


# A running response may be rewritten with its progress (same status); a final one never.
_NEXT: dict[ResponseStatus, frozenset[ResponseStatus]] = {
    ResponseStatus.QUEUED: frozenset({
        ResponseStatus.QUEUED, ResponseStatus.IN_PROGRESS, ResponseStatus.FAILED,
        ResponseStatus.CANCELLED,
    }),
    ResponseStatus.IN_PROGRESS: frozenset({
        ResponseStatus.IN_PROGRESS, ResponseStatus.COMPLETED, ResponseStatus.INCOMPLETE,
        ResponseStatus.FAILED, ResponseStatus.CANCELLED,
    }),
}


def _items(value: Sequence[Mapping[str, Any]]) -> tuple[JSON, ...]:
    return tuple(dict(item) for item in value)


@attrs.frozen
class StoredResponse:
    """One response as stored.

    ``input_items`` are this turn's input only (each with an ``id``, for the input_items
    list's cursors); the turns before it are reached through ``previous_response_id``
    (``ResponseStore.chain``), so a long chain costs storage linear in its length.
    ``expires_at`` is stamped by the store on write (``created_at`` plus its TTL).
    ``updated_at``: when its owner last wrote it; a running response not written for long
    has lost its owner (``responses.lifecycle``).
    """

    id: str
    created_at: float
    status: ResponseStatus = attrs.field(converter=ResponseStatus)
    response: JSON = attrs.field(converter=dict)
    input_items: tuple[JSON, ...] = attrs.field(converter=_items, default=())
    previous_response_id: str | None = None
    expires_at: float | None = None
    updated_at: float | None = None

    @property
    def output_items(self) -> list[JSON]:
        return list(self.response.get("output") or ())

    def advance(self, status: ResponseStatus, response: Mapping[str, Any]) -> StoredResponse:
        """This record with a new status and response object; refuses a transition the
        lifecycle does not have."""
        if not self.status.may_become(status):
            raise InvalidTransition(self.id, self.status.value, status.value)
        return attrs.evolve(self, status=status, response=dict(response))

    def to_json(self) -> JSON:
        return {
            "id": self.id, "created_at": self.created_at, "expires_at": self.expires_at,
            "status": self.status.value, "response": self.response,
            "input_items": list(self.input_items),
            "previous_response_id": self.previous_response_id,
            "updated_at": self.updated_at,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StoredResponse:
        return cls(
            id=data["id"], created_at=data["created_at"], expires_at=data.get("expires_at"),
            status=data["status"], response=data["response"],
            input_items=data.get("input_items") or (),
            previous_response_id=data.get("previous_response_id"),
            updated_at=data.get("updated_at"),
        )


def conversation(chain: Sequence[StoredResponse]) -> list[JSON]:
    """The items of a chain of turns, oldest first: each turn's input then its output (messages,
    reasoning, function calls), the prefix the next turn's prompt is built from."""
    items: list[JSON] = []
    for record in chain:
        items.extend(record.input_items)
        items.extend(record.output_items)
    return items


def sequence_number(event: Mapping[str, Any]) -> int:
    number = event.get("sequence_number")
    if not isinstance(number, int) or isinstance(number, bool):
        raise ValueError(f"a stored event needs an integer sequence_number, got {number!r}")
    return number
