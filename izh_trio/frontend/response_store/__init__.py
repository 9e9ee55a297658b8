"""Where the Responses API keeps stored responses and their event logs: SQLite in the cache
directory by default, Redis to share them between replicas (``open_store``)."""

from izh_trio.frontend.response_store.errors import (
    InvalidTransition,
    StoreUnavailable,
    UnknownResponse,
)
from izh_trio.frontend.response_store.factory import (
    check_url,
    default_sqlite_path,
    describe,
    expire_periodically,
    open_store,
)
from izh_trio.frontend.response_store.paging import ItemPage, PageError, page_items
from izh_trio.frontend.response_store.protocol import (
    DEFAULT_MAX_ROWS,
    DEFAULT_TTL_S,
    ResponseStore,
)
from izh_trio.frontend.response_store.records import (
    ResponseStatus,
    StoredResponse,
    conversation,
)

__all__ = [
    "DEFAULT_MAX_ROWS",
    "DEFAULT_TTL_S",
    "InvalidTransition",
    "ItemPage",
    "PageError",
    "ResponseStatus",
    "ResponseStore",
    "StoreUnavailable",
    "StoredResponse",
    "UnknownResponse",
    "check_url",
    "conversation",
    "default_sqlite_path",
    "describe",
    "expire_periodically",
    "open_store",
    "page_items",
]
