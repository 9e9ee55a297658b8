"""What a response store raises: the route maps each to one HTTP answer."""

from __future__ import annotations


class StoreUnavailable(Exception):
    """The store cannot be reached or used (down, timed out, unwritable, newer schema): a 503.
    Requests with ``store: false`` never touch the store, so they keep working."""


class UnknownResponse(KeyError):
    """No stored (unexpired) response has this id: a 404 naming it."""

    def __init__(self, response_id: str) -> None:
        super().__init__(response_id)
        self.response_id = response_id

    def __str__(self) -> str:
        return f"no stored response with id {self.response_id!r}"


class InvalidTransition(ValueError):
    """A write would move a response out of a final status, or skip its lifecycle (for
    instance a ``completed`` write over a response another replica already ``cancelled``)."""

    def __init__(self, response_id: str, current: str, new: str) -> None:
        super().__init__(f"response {response_id!r} is {current}: cannot become {new}")
        self.response_id = response_id
        self.current = current
        self.new = new
