"""The background responses this process runs now, by id: what a cancel, a delete and a
follower of its events need of one while it runs here (on another replica, they go through
the store alone)."""

from __future__ import annotations

import attrs
import trio


@attrs.define(eq=False)
class Run:
    """One background response running in this process."""

    scope: trio.CancelScope = attrs.Factory(trio.CancelScope)
    #: Set once its last state is stored (whatever the end).
    done: trio.Event = attrs.Factory(trio.Event)
    #: Replaced each time it stores events: followers wait on the current one.
    changed: trio.Event = attrs.Factory(trio.Event)

    def stored(self) -> None:
        """New events are in the store: wake whoever follows them."""
        self.changed.set()
        self.changed = trio.Event()

    async def stop(self) -> None:
        """Cancel it and wait until its end is stored."""
        self.scope.cancel()
        await self.done.wait()


class Runs:
    def __init__(self) -> None:
        self._runs: dict[str, Run] = {}

    def start(self, response_id: str) -> Run:
        run = self._runs[response_id] = Run()
        return run

    def end(self, response_id: str) -> None:
        run = self._runs.pop(response_id, None)
        if run is not None:
            run.stored()
            run.done.set()

    def get(self, response_id: str) -> Run | None:
        return self._runs.get(response_id)

    def __len__(self) -> int:
        return len(self._runs)
