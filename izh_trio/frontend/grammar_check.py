"""A request's grammar, compiled by a grammar worker: the verdict as the client reads it.

llguidance's errors say what is wrong with a grammar, but a panic's text is the library's
internals (an assertion, a native backtrace with build paths), and some errors append a
dump of the matcher's state: the client gets the first part only, capped, and for a panic
one plain sentence. A worker's crash or a compile over its time bound is the grammar's
fault (400); no worker free in time is the server's (503).
"""

from __future__ import annotations

import re

from izh_trio.frontend.errors import APIError
from izh_trio.frontend.grammar_pool import (
    GrammarBusy,
    GrammarCrashed,
    GrammarPool,
    GrammarTimeout,
    GrammarUnavailable,
)

#: Longest library error passed on to a client.
MAX_ERROR_CHARS = 600
#: Marks of a Rust panic: its text names the library's internals, never the request's fault.
_PANIC = ("panicked at", "panic:", "<backtrace>", "stack backtrace", "RUST_BACKTRACE")
#: Where llguidance's messages turn into dumps of its state, and source locations.
_DUMPS = ("<state>", "<grammar>", "<backtrace>")
_SOURCE = re.compile(r"\S*(?:\.rs:\d+|/rustc/|\.cargo/registry)\S*")


def public_message(error: str) -> str:
    """llguidance's error as a client may read it: what is wrong with the grammar, not the
    library's internals (panic text, backtraces, build paths, state dumps), capped."""
    if any(mark in error for mark in _PANIC):
        return "the grammar is too large or too complex to compile"
    for mark in _DUMPS:
        error = error.split(mark, 1)[0]
    error = _SOURCE.sub("", error).strip() or "the grammar does not compile"
    return error if len(error) <= MAX_ERROR_CHARS else error[:MAX_ERROR_CHARS - 1] + "…"


async def check_grammar(pool: GrammarPool, grammar: str, param: str) -> None:
    """Compile the grammar once, in a grammar worker, as the engine will: a 400 naming
    ``param`` if it cannot be (a 503 if no worker can take it now)."""
    try:
        grammar.encode()
    except UnicodeEncodeError:  # a lone surrogate from a JSON body's "\ud800"
        raise APIError(400, f"the {param} constraint holds text that is not valid Unicode "
                            "(a lone surrogate)", param=param) from None
    try:
        error = await pool.check(grammar)
    except GrammarTimeout:
        raise APIError(400, f"the {param} grammar took too long to compile (over "
                            f"{pool.settings.job_timeout:g} s); simplify it",
                       param=param) from None
    except GrammarCrashed:
        raise APIError(400, f"the {param} grammar could not be compiled: it is too large or "
                            "nested too deeply", param=param) from None
    except (GrammarBusy, GrammarUnavailable):
        raise APIError(503, "grammars cannot be compiled right now; retry shortly",
                       param=param, headers={"Retry-After": "1"}) from None
    if error:
        raise APIError(400, f"invalid {param}: {public_message(error)}", param=param)
