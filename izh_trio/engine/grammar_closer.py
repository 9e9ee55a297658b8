"""The shortest way a constrained output can still end: how it ends within ``max_tokens``.

A grammar bounds what an output may be, not how long it runs: a JSON string, an array or a
schema's required properties can outlast any budget. The engine keeps every constrained
request able to finish in the tokens it has left (``GuidedDecoding.keep_closable``), and for
that it needs, from any state of the request's matcher, a short token path to a state where
the grammar may end.

The path is found on the matcher itself, so it is valid by construction for every grammar
(JSON schemas, tool calls, regexes, Lark): a walk one byte at a time that, at each step,
takes the first byte the grammar allows from an order that heads for the end of JSON
structures: close a string, an object, an array; separate; then the shortest values
(``0``, ``[]``, ``{}``, ``null``...); then anything, including a multi-byte character's
continuation bytes (an output cut inside one) and special tokens (``</tool_call>``). The
bytes are then cut into tokens as a steered output would take them, under the grammar's
mask, so the path's length is what ending really costs. A walk that finds no end within its
bound returns None: the grammar cannot be shown to close.
"""

from __future__ import annotations

from collections import Counter

import llguidance

#: Bytes tried first at each step, in this order: toward the end of JSON structures. Inside
#: a string (where a space is allowed: compact JSON has none elsewhere) '"' goes first.
_JSON_FIRST = b'}]",:0[{ntf123456789-.eE+'
#: The order of a second walk, when the first found no end (a regex like ``[a-z]+@...``
#: or ``(ab)+c`` that the first walk extends forever): the bytes it has used least so far
#: first, punctuation before the rest among equals.
_PUNCTUATION_FIRST = bytes(b for b in range(33, 127) if not chr(b).isalnum())
#: Longest walk, in bytes (or special tokens), before giving up.
MAX_PATH = 512
#: Longest vocabulary entry looked for when re-tokenizing a path.
_MAX_TOKEN_BYTES = 48


class GrammarCloser:
    def __init__(self, tokenizer: llguidance.LLTokenizer, vocab_size: int) -> None:
        byte_token: dict[int, int] = {}
        self._token_of: dict[bytes, int] = {}
        specials: list[int] = []
        for token in range(min(vocab_size, tokenizer.vocab_size)):
            if tokenizer.is_special_token(token):
                specials.append(token)
                continue
            raw = tokenizer.decode_bytes([token])
            if not raw:
                continue
            self._token_of.setdefault(raw, token)
            if len(raw) == 1:
                byte_token.setdefault(raw[0], token)
        specials = [t for t in specials if t not in tokenizer.eos_tokens]
        self._orders = []
        for first in (_JSON_FIRST, _PUNCTUATION_FIRST):
            order = list(first) + [b for b in range(256) if b not in first]
            self._orders.append([byte_token[b] for b in order if b in byte_token] + specials)
        self._byte_of = {t: b for b, t in byte_token.items()}
        self._byte_token = byte_token
        quote = byte_token.get(ord('"'))
        self._string_first = [*([] if quote is None else [quote]),
                              *(t for t in self._orders[0] if t != quote)]
        self._space = byte_token.get(ord(" "))
        #: The eos token a path ends with when its grammar could go on.
        self.eos = tokenizer.eos_token
        self._tokenizer = tokenizer

    def path(self, matcher: llguidance.LLMatcher) -> list[int] | None:
        """The tokens that end the output from ``matcher``'s state, the eos included when
        the grammar could go on; the matcher is left as it was found. None: no end found
        within the bound."""
        walked = self._walk(matcher, self._orders[0], least_used=False)
        if walked is None:
            walked = self._walk(matcher, self._orders[1], least_used=True)
        if walked is None:
            return None
        units, stopped = walked
        tokens = self._tokens_along(matcher, units)
        if tokens is None:
            return None
        return tokens if stopped else [*tokens, self.eos]

    def _walk(self, matcher: llguidance.LLMatcher, order: list[int], *, least_used: bool
              ) -> tuple[list[int], bool] | None:
        """(bytes and special tokens to a state where the grammar may end, whether it must)."""
        units: list[int] = []
        try:
            while not matcher.is_accepting():
                if len(units) >= MAX_PATH:
                    return None
                # A key's or an enum value's rest: no choice to make. (0xff starts a special
                # token in llguidance's byte view: those are left to the walk.)
                forced_bytes = matcher.compute_ff_bytes().partition(b"\xff")[0]
                forced = [self._byte_token[b] for b in forced_bytes if b in self._byte_token]
                if forced:
                    units += forced[:matcher.try_consume_tokens(forced)]
                    continue
                candidates = order
                if least_used:
                    uses = Counter(units)
                    candidates = sorted(order, key=lambda t: uses[t])  # stable: ties in order
                elif self._in_string(matcher):
                    candidates = self._string_first
                for token in candidates:
                    if matcher.try_consume_tokens([token]) == 1:
                        units.append(token)
                        break
                else:
                    return None
            return units, matcher.is_stopped()
        finally:
            if units:
                matcher.rollback(len(units))

    def _in_string(self, matcher: llguidance.LLMatcher) -> bool:
        if self._space is None or matcher.try_consume_tokens([self._space]) != 1:
            return False
        matcher.rollback(1)
        return True

    def _tokens_along(self, matcher: llguidance.LLMatcher, units: list[int]
                      ) -> list[int] | None:
        """The same bytes as the vocabulary's tokens, as a steered output would take them:
        at each step the canonical token of the rest if the grammar's mask allows it (in a
        forced stretch llguidance allows only that one), else the longest allowed token.
        None if the matcher fails on the way (a limit of the library hit)."""
        tokens: list[int] = []
        i = 0
        try:
            while i < len(units):
                run = bytearray()
                for unit in units[i:]:
                    byte = self._byte_of.get(unit)
                    if byte is None:
                        break
                    run.append(byte)
                if not run:  # a special token
                    token, width = units[i], 1
                else:
                    token, width = self._next_token(matcher, bytes(run))
                if matcher.try_consume_tokens([token]) != 1:
                    return None
                tokens.append(token)
                i += width
            return tokens
        finally:
            if tokens:
                matcher.rollback(len(tokens))

    def _next_token(self, matcher: llguidance.LLMatcher, run: bytes) -> tuple[int, int]:
        mask = matcher.compute_bitmask()

        def allowed(token: int) -> bool:
            return bool(mask[token >> 3] >> (token & 7) & 1)

        canonical = self._tokenizer.tokenize_bytes(run)[0]
        width = len(self._tokenizer.decode_bytes([canonical]))
        if allowed(canonical) and run.startswith(self._tokenizer.decode_bytes([canonical])):
            return canonical, width
        for k in range(min(_MAX_TOKEN_BYTES, len(run)), 0, -1):
            token = self._token_of.get(run[:k])
            if token is not None and allowed(token):
                return token, k
        return self._byte_token[run[0]], 1  # the walk took this byte: always valid
