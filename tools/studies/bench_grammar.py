"""Compare llguidance and xgrammar for guided decoding on CPU: compile time and per-step mask time.

    python -m tools.studies.bench_grammar [--json OUT] [--reps 10] [--threads N] [--batch 32]
    python -m tools.studies.bench_grammar --libs llguidance --vocabs synth150k --grammars tool_call

Two vocabularies: the embedded tiny checkpoint's tokenizer (2,000 byte-level BPE entries,
Qwen3 special tokens) and a seeded synthetic byte-level vocabulary the size of Qwen3's
(151,643 regular entries plus Qwen3's added tokens). Five grammars: any JSON object, a
realistic JSON schema, an email regex, a choice among five strings, and a Qwen3 tool call
with two functions. For every library x vocabulary x grammar it measures

* compile time: cold (first compile of that grammar) and warm (same grammar again: a cache
  hit for xgrammar; llguidance has no compile cache, so a fresh ``LLMatcher``), plus the
  cost of a per-request matcher (``GrammarMatcher(compiled)`` / ``LLMatcher.deep_copy()``);
* the per-step token-mask time while walking a valid output (tokenized with that vocabulary,
  then EOS): the mask before each token is checked to allow the token (rejections must be
  0; the token is fed to the matcher either way, and must be accepted) and to never allow
  ``<|im_start|>`` (a special token that has no business inside guided output);
* a batch of matchers stepping together at staggered positions
  (``LLExecutor`` / ``BatchGrammarMatcher``): wall time of one batched mask fill.

Each walk starts from a new per-request matcher, as a server would: llguidance builds an
``LLMatcher`` from the grammar text (its lexer is built lazily, so the first masks of a walk
carry that work); xgrammar makes a ``GrammarMatcher`` from the cached compiled grammar.
Exit status: 0 when every walk was clean, 3 when some step was rejected or failed.
Needs ``pip install llguidance xgrammar`` (xgrammar requires torch, transformers and
apache-tvm-ffi; llguidance has no Python dependencies) and ``transformers`` for xgrammar's
``TokenizerInfo.from_huggingface``. Pick a subset with ``--libs``/``--vocabs``/``--grammars``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

EXIT_VIOLATIONS = 3
QWEN3_REGULAR_VOCAB = 151_643  # Qwen3's BPE entries before the added tokens (ids 151643...)
# Qwen3's added tokens in id order, with the "special" flag of its tokenizer.json.
QWEN3_ADDED: list[tuple[str, bool]] = [
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", True),
    ("<|fim_middle|>", True),
    ("<|fim_suffix|>", True),
    ("<|fim_pad|>", True),
    ("<|repo_name|>", True),
    ("<|file_sep|>", True),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
]


# --------------------------------------------------------------------------- vocabularies


@dataclass
class Vocab:
    name: str
    tokens: list[bytes]  # token id -> raw bytes (special tokens: their literal text)
    special_ids: list[int]
    eos_ids: list[int]  # <|im_end|> first (the chat stop token), then <|endoftext|>
    im_start_id: int
    encode: Callable[[str], list[int]]
    tokenizer_json: Path | None = None  # the HF tokenizer.json this came from, if any
    build_s: float = 0.0

    @property
    def size(self) -> int:
        return len(self.tokens)


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


_COMMON_WORDS = _words("""
the of and to in is that for it as was with be by on not he this are or his from at which but
have an they you were her she there been one all we their has would when if so no out what up
said about other into more time can only new some could them these two may first then do any
like my now over such our man me even most made after also did many before must through back
years where much your way well down should because each just those people how too little state
good very make world still own see men work long here get both between life being under never
day same another know while last might us great old year off come since against go came right
used take three number value name type data user email list item items string true false null
error message status result function return import class def self print config file path
order total price amount currency customer address city country weather location unit search
query page size count index start end date time zone event created updated version model token
request response server client stream content role system assistant tool call arguments call
north south east west temperature forecast celsius fahrenheit priority task title label team
""")
_ONSETS = (
    "",
    *_words(
        "b c d f g h j k l m n p r s t v w y z bl br ch cl cr dr fl fr gl gr pl "
        "pr sc sh sk sl sm sn sp st str sw th tr tw wh wr"
    ),
)
_NUCLEI = ("a", "e", "i", "o", "u", "ai", "au", "ea", "ee", "ei", "ie", "io", "oa", "oo", "ou", "y")
_CODAS = (
    "",
    *_words(
        "b ck d ft g k l ld ll lt m mp n nd ng nk nt p r rd rk rm rn rt s sh sk ss st t th x z"
    ),
)
_SUFFIXES = (
    "ing",
    "ed",
    "er",
    "ers",
    "ly",
    "tion",
    "tions",
    "ment",
    "ness",
    "able",
    "al",
    "ic",
    "ous",
    "ive",
    "est",
    "s",
    "es",
    "ity",
    "ize",
    "ized",
)
_PUNCT = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"
_JSON_FRAGMENTS = (
    '{"',
    '":',
    '",',
    '"}',
    '":"',
    '","',
    '"},',
    '"}]',
    '[{"',
    '":{"',
    '":[',
    '":["',
    '"],"',
    '},{"',
    "}}",
    "}}}",
    "}]}",
    "]}",
    '": "',
    '", "',
    '": {',
    '": [',
    '"},',
    "{}",
    "[]",
    "],",
    "},",
    "]]",
    "[[",
    ":true",
    ":false",
    ":null",
    '":true',
    '":false',
    '":null',
    '": true',
    '": false',
    '": null',
    '":0',
    '": 0',
    '":1',
    '":[]',
    '":{}',
    '"]}',
    '"]',
    '"}}',
    '"}}}',
)


def _pseudo_word(rng: random.Random) -> str:
    n = rng.choices((1, 2, 3), weights=(5, 4, 1))[0]
    w = "".join(rng.choice(_ONSETS) + rng.choice(_NUCLEI) + rng.choice(_CODAS) for _ in range(n))
    if rng.random() < 0.25:
        w += rng.choice(_SUFFIXES)
    return w[:16]


def _cased(rng: random.Random, w: str) -> str:
    r = rng.random()
    if r < 0.2:
        w = w.capitalize()
    elif r < 0.23:
        w = w.upper()
    return (" " + w) if rng.random() < 0.5 else w


def _accented(rng: random.Random, w: str) -> str:
    swap = {"a": "áàâäã", "e": "éèêë", "i": "íìî", "o": "óòôöø", "u": "úùûü", "n": "ñ", "c": "ç"}
    out = [rng.choice(swap[c]) if c in swap and rng.random() < 0.35 else c for c in w]
    return "".join(out)


def synth_vocab(seed: int, regular: int = QWEN3_REGULAR_VOCAB) -> list[tuple[bytes, bool]]:
    """A deterministic byte-level vocabulary: 256 bytes, ``regular - 256`` multi-byte pieces
    shaped like a real BPE vocab, then Qwen3's added tokens. Returns (bytes, is_special)."""
    rng = random.Random(seed)
    seen: set[bytes] = {bytes([b]) for b in range(256)}
    pieces: list[bytes] = []

    def add(s: str | bytes) -> None:
        b = s.encode() if isinstance(s, str) else s
        if len(b) > 1 and b not in seen and len(pieces) < regular - 256:
            seen.add(b)
            pieces.append(b)

    # Structure first (these are few and all present in real vocabs), then the bulk.
    for frag in _JSON_FRAGMENTS:
        add(frag)
        add(" " + frag)
        add(frag + "\n")
    for k in range(2, 81):
        add(" " * k)
    for k in range(1, 17):
        add("\t" * k)
        add("\n" + "\t" * k)
    for k in range(1, 9):
        add("\n" * k)
        add("\r\n" * k)
    for k in range(1, 33):
        add("\n" + " " * k)
        add("\n" + " " * k + '"')
        add(" " * k + '"')
    for n in range(100):
        add(f"{n:02d}")
        add(f" {n}")
    for n in range(1000):
        add(f"{n:03d}")
        add(str(n))
    for w in _COMMON_WORDS:
        for v in (w, w.capitalize(), '"' + w, w + '"', '"' + w + '":'):
            add(v)
            add(" " + v)
    for _ in range(6000):  # punctuation runs, code-ish operators
        p = "".join(rng.choice(_PUNCT) for _ in range(rng.choice((2, 2, 3, 4))))
        add((" " if rng.random() < 0.4 else "") + p + ("\n" if rng.random() < 0.1 else ""))
    for _ in range(22000):  # CJK pieces (3 bytes a character)
        add("".join(chr(rng.randint(0x4E00, 0x9FFF)) for _ in range(rng.choice((1, 1, 2, 3)))))
    for _ in range(400):  # partial UTF-8 sequences, as real byte-level BPE vocabs have
        add(chr(rng.randint(0x4E00, 0x9FFF)).encode()[:2])
    for _ in range(8000):  # accented Latin words
        add(_cased(rng, _accented(rng, _pseudo_word(rng))))
    for _ in range(3000):  # Cyrillic pieces
        add(
            (" " if rng.random() < 0.5 else "")
            + "".join(chr(rng.randint(0x430, 0x44F)) for _ in range(rng.randint(2, 7)))
        )
    for _ in range(4000):  # identifiers
        a, b = _pseudo_word(rng), _pseudo_word(rng)
        add(rng.choice((f"{a}_{b}", f"{a}{b.capitalize()}", f"_{a}", f".{a}", f"{a}(", f"{a}.")))
    while len(pieces) < regular - 256:  # English-like word pieces fill the rest
        add(_cased(rng, _pseudo_word(rng)))
    rng.shuffle(pieces)  # ids of a real vocab follow merge order, not category
    out = [(bytes([b]), False) for b in range(256)] + [(p, False) for p in pieces]
    out += [(t.encode(), special) for t, special in QWEN3_ADDED]
    return out


def greedy_encoder(tokens: Sequence[bytes], skip: set[int]) -> Callable[[bytes], list[int]]:
    """Greedy longest-match tokenizer over raw token bytes (not BPE; fine for benchmarking)."""
    table = {t: i for i, t in enumerate(tokens) if i not in skip}
    longest = max(len(t) for t in table)

    def encode(data: bytes) -> list[int]:
        ids: list[int] = []
        i, n = 0, len(data)
        while i < n:
            for k in range(min(longest, n - i), 0, -1):
                tid = table.get(data[i : i + k])
                if tid is not None:
                    ids.append(tid)
                    i += k
                    break
            else:  # unreachable: every single byte is a token
                raise ValueError(f"no token for byte {data[i]}")
        return ids

    return encode


def load_synth(seed: int) -> Vocab:
    t0 = time.perf_counter()
    entries = synth_vocab(seed)
    tokens = [b for b, _ in entries]
    special = [i for i, (_, s) in enumerate(entries) if s]
    ids = {b: i for i, b in enumerate(tokens)}
    enc = greedy_encoder(tokens, set(special))
    return Vocab(
        name="synth150k",
        tokens=tokens,
        special_ids=special,
        eos_ids=[ids[b"<|im_end|>"], ids[b"<|endoftext|>"]],
        im_start_id=ids[b"<|im_start|>"],
        encode=lambda s: enc(s.encode()),
        build_s=time.perf_counter() - t0,
    )


def load_tiny() -> Vocab:
    from tokenizers import Tokenizer

    from izh_trio.tiny import default_tiny_dir

    t0 = time.perf_counter()
    path = Path(default_tiny_dir()) / "tokenizer.json"
    hf = Tokenizer.from_file(str(path))
    spec = json.loads(path.read_text())
    n = hf.get_vocab_size(with_added_tokens=True)
    # Byte-level BPE: map each vocab string back to raw bytes (GPT-2 byte<->unicode table).
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    unbyte = {chr(b): b for b in keep}
    extra = 0
    for b in range(256):
        if b not in unbyte.values():
            unbyte[chr(256 + extra)] = b
            extra += 1
    added = {a["id"]: a for a in spec["added_tokens"]}
    tokens: list[bytes] = []
    for i in range(n):
        s = hf.id_to_token(i)
        tokens.append(s.encode() if i in added else bytes(unbyte[c] for c in s))
    special = sorted(i for i, a in added.items() if a["special"])
    ids = {a["content"]: i for i, a in added.items()}
    return Vocab(
        name="tiny2k",
        tokens=tokens,
        special_ids=special,
        eos_ids=[ids["<|im_end|>"], ids["<|endoftext|>"]],
        im_start_id=ids["<|im_start|>"],
        encode=lambda s: hf.encode(s, add_special_tokens=False).ids,
        tokenizer_json=path,
        build_s=time.perf_counter() - t0,
    )


# ------------------------------------------------------------------------------- grammars

TICKET_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 80},
        "priority": {"type": "integer", "minimum": 1, "maximum": 5},
        "estimate_hours": {"type": "number"},
        "urgent": {"type": "boolean"},
        "status": {"enum": ["open", "in_progress", "blocked", "done"]},
        "assignee": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 40},
                "email": {"type": "string"},
                "team": {"enum": ["infra", "ml", "web"]},
            },
            "required": ["name", "team"],
            "additionalProperties": False,
        },
        "subtasks": {
            "type": "array",
            "maxItems": 10,
            "items": {
                "type": "object",
                "properties": {
                    "title": {"type": "string", "maxLength": 60},
                    "done": {"type": "boolean"},
                    "points": {"type": "integer"},
                },
                "required": ["title", "done"],
                "additionalProperties": False,
            },
        },
        "labels": {"type": "array", "items": {"type": "string", "maxLength": 20}},
    },
    "required": ["title", "priority", "status", "assignee", "subtasks"],
    "additionalProperties": False,
}
TICKET_TEXT = json.dumps(
    {
        "title": "Grammar mask latency regresses with the 150k vocabulary",
        "priority": 2,
        "estimate_hours": 6.5,
        "urgent": False,
        "status": "in_progress",
        "assignee": {"name": "Renée Okafor", "email": "renee@example.org", "team": "infra"},
        "subtasks": [
            {"title": "Write the benchmark", "done": True, "points": 3},
            {"title": "Profile the first mask after compile", "done": False, "points": 2},
            {"title": "Pick a library", "done": False},
        ],
        "labels": ["perf", "guided-decoding", "cpu"],
    },
    ensure_ascii=False,
)

ANY_OBJECT_TEXT = json.dumps(
    {
        "id": "evt_8f14e45fceea167a",
        "type": "order.created",
        "created": 1718035200,
        "livemode": False,
        "data": {
            "order": {
                "total": 129.95,
                "currency": "EUR",
                "items": [
                    {"sku": "A-100", "qty": 2, "tags": ["gift", "fragile"]},
                    {"sku": "B-7", "qty": 1, "tags": [], "discount": -0.15},
                ],
                "customer": {"name": "Zoë Müller", "email": "zoe@example.de", "note": None},
            }
        },
        "message": "Bitte vor 12 Uhr liefern.\nDanke! 谢谢, до свидания",
    },
    ensure_ascii=False,
)

EMAIL_REGEX = r"[a-zA-Z0-9._%+-]+@[a-zA-Z0-9-]+(\.[a-zA-Z0-9-]+)*\.[a-zA-Z]{2,}"
EMAIL_TEXT = "jane.doe+billing@mail.example-corp.co.uk"

CHOICES = ["positive", "negative", "neutral", "mixed", "not applicable"]

TOOLS: dict[str, dict[str, Any]] = {
    "get_weather": {
        "type": "object",
        "properties": {
            "location": {"type": "string", "description": "City and country"},
            "unit": {"enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 14},
        },
        "required": ["location", "unit"],
        "additionalProperties": False,
    },
    "search_web": {
        "type": "object",
        "properties": {
            "query": {"type": "string", "maxLength": 200},
            "max_results": {"type": "integer"},
            "safe": {"type": "boolean"},
        },
        "required": ["query"],
        "additionalProperties": False,
    },
}
TOOL_CALL_TEXT = (
    '<tool_call>\n{"name": "get_weather", "arguments": '
    + json.dumps({"location": "São Paulo, BR", "unit": "celsius", "days": 3}, ensure_ascii=False)
    + "}\n</tool_call>"
)


def _tool_begin(name: str) -> str:
    return '<tool_call>\n{"name": "' + name + '", "arguments": '


def _tool_call_lark(special_tags: bool) -> str:
    """``special_tags``: the tokenizer treats <tool_call> as a special token, which lark must
    name as a token (``<tool_call>``); a quoted "<tool_call>" would have to be spelled in bytes."""
    if special_tags:
        open_, close = "<tool_call> ", " </tool_call>"
    else:
        open_, close = '"<tool_call>" ', ' "</tool_call>"'
    lines = ["start: " + " | ".join(TOOLS)]
    for name, schema in TOOLS.items():
        begin = json.dumps(_tool_begin(name).removeprefix("<tool_call>"))
        lines.append(f"{name}: {open_}{begin} {name}_args " + r'"}\n"' + close)
        lines.append(f"{name}_args: %json " + json.dumps(schema))
    return "\n".join(lines) + "\n"


def _tool_call_structural_tag() -> dict[str, Any]:
    tags = [
        {
            "type": "tag",
            "begin": _tool_begin(name),
            "content": {"type": "json_schema", "json_schema": schema},
            "end": "}\n</tool_call>",
        }
        for name, schema in TOOLS.items()
    ]
    return {"type": "structural_tag", "format": {"type": "or", "elements": tags}}


@dataclass
class Case:
    name: str
    text: str  # a valid output
    what: str
    llg: Callable[[Any, Vocab], str]  # (LLTokenizer, vocab) -> llguidance grammar text
    xgr: Callable[[Any], Any]  # GrammarCompiler -> CompiledGrammar


def _cases() -> list[Case]:
    def llg_m() -> Any:
        import llguidance

        return llguidance.LLMatcher

    return [
        Case(
            "json_object",
            ANY_OBJECT_TEXT,
            "any JSON object (llg: schema {type: object}; xgr: builtin JSON grammar)",
            lambda _t, _v: llg_m().grammar_from_json_schema({"type": "object"}),
            lambda c: c.compile_builtin_json_grammar(),
        ),
        Case(
            "json_schema",
            TICKET_TEXT,
            "nested ticket schema: enum, int range, number, bool, array of objects, maxLength",
            lambda _t, _v: llg_m().grammar_from_json_schema(TICKET_SCHEMA),
            lambda c: c.compile_json_schema(TICKET_SCHEMA),
        ),
        Case(
            "regex_email",
            EMAIL_TEXT,
            "email regex",
            lambda _t, _v: llg_m().grammar_from_regex(EMAIL_REGEX),
            lambda c: c.compile_regex(EMAIL_REGEX),
        ),
        Case(
            "choice5",
            "neutral",
            "one of 5 strings (llg: lark; xgr: EBNF)",
            lambda _t, _v: llg_m().grammar_from_lark(
                "start: " + " | ".join(json.dumps(s) for s in CHOICES) + "\n"
            ),
            lambda c: c.compile_grammar("root ::= " + " | ".join(json.dumps(s) for s in CHOICES)),
        ),
        Case(
            "tool_call",
            TOOL_CALL_TEXT,
            "Qwen3 <tool_call> with 2 functions (llg: lark %json; xgr: structural tag)",
            lambda t, v: llg_m().grammar_from_lark(
                _tool_call_lark(t.is_special_token(v.tokens.index(b"<tool_call>")))
            ),
            lambda c: c.compile_structural_tag(_tool_call_structural_tag()),
        ),
    ]


# ------------------------------------------------------------------------------- backends


class Backend:
    """One library bound to one vocabulary. Matchers are opaque to the driver."""

    name = ""

    def __init__(self, vocab: Vocab, threads: int) -> None:
        self.vocab = vocab
        self.threads = threads

    def compile_cold(self, case: Case) -> float: ...
    def compile_warm(self, case: Case) -> float: ...
    def clone_template(self, case: Case) -> float: ...
    def new_matcher(self, case: Case) -> Any: ...
    def alloc(self, rows: int) -> tuple[Any, np.ndarray]: ...
    def fill(self, m: Any, mask: Any) -> None: ...
    def consume(self, m: Any, tok: int) -> bool: ...
    def finished(self, m: Any) -> bool: ...
    def reset(self, m: Any) -> None: ...
    def batch_fill(self, ms: list[Any], mask: Any) -> None: ...
    def batch_consume(self, ms: list[Any], toks: list[int]) -> list[bool]: ...


class LlgBackend(Backend):
    name = "llguidance"

    def __init__(self, vocab: Vocab, threads: int) -> None:
        super().__init__(vocab, threads)
        import llguidance
        import llguidance.numpy as llnp

        self.llg, self.llnp = llguidance, llnp
        t0 = time.perf_counter()
        if vocab.tokenizer_json is not None:
            self.tok = llguidance.LLTokenizer(
                vocab.tokenizer_json.read_text(), eos_token=vocab.eos_ids
            )
        else:
            enc = greedy_encoder(vocab.tokens, set(vocab.special_ids))

            class _Raw:  # what TokenizerWrapper reads
                tokens = vocab.tokens
                eos_token_id = vocab.eos_ids[0]
                bos_token_id = None
                special_token_ids = vocab.special_ids

                def __call__(self, data: bytes) -> list[int]:
                    return enc(data)

            self.tok = llguidance.LLTokenizer(
                llguidance.TokenizerWrapper(_Raw()), eos_token=vocab.eos_ids
            )
        self.tokenizer_s = time.perf_counter() - t0
        self.executor = llguidance.LLExecutor(num_threads=threads)
        self.grammars: dict[str, str] = {}
        self.templates: dict[str, Any] = {}

    def _matcher(self, case: Case) -> Any:
        g = self.grammars.get(case.name)
        if g is None:
            g = self.grammars[case.name] = case.llg(self.tok, self.vocab)
        m = self.llg.LLMatcher(self.tok, g, log_level=0)
        if m.is_error():
            raise RuntimeError(f"llguidance {case.name}: {m.get_error()}")
        return m

    def compile_cold(self, case: Case) -> float:
        t0 = time.perf_counter()
        self.templates[case.name] = self._matcher(case)
        return time.perf_counter() - t0

    compile_warm = compile_cold  # no compiler cache: every LLMatcher compiles its grammar

    def clone_template(self, case: Case) -> float:
        t0 = time.perf_counter()
        self.templates[case.name].deep_copy()
        return time.perf_counter() - t0

    new_matcher = _matcher

    def alloc(self, rows: int) -> tuple[Any, np.ndarray]:
        a = self.llnp.allocate_token_bitmask(rows, self.tok.vocab_size)
        return a, a

    def fill(self, m: Any, mask: Any) -> None:
        self.llnp.fill_next_token_bitmask(m, mask, 0)

    def consume(self, m: Any, tok: int) -> bool:
        return bool(m.consume_token(tok))

    def finished(self, m: Any) -> bool:
        return bool(m.is_stopped()) and not m.is_error()

    def reset(self, m: Any) -> None:
        m.reset()

    def batch_fill(self, ms: list[Any], mask: Any) -> None:
        rows = list(zip(ms, range(len(ms)), strict=True))
        self.llnp.fill_next_token_bitmask_par(self.executor, rows, mask)

    def batch_consume(self, ms: list[Any], toks: list[int]) -> list[bool]:
        return self.llnp.consume_token_par(self.executor, list(zip(ms, toks, strict=True)))


class XgrBackend(Backend):
    name = "xgrammar"

    def __init__(self, vocab: Vocab, threads: int) -> None:
        super().__init__(vocab, threads)
        import xgrammar

        self.xgr = xgrammar
        t0 = time.perf_counter()
        if vocab.tokenizer_json is not None:
            from transformers import PreTrainedTokenizerFast

            hf = PreTrainedTokenizerFast(tokenizer_file=str(vocab.tokenizer_json))
            self.info = xgrammar.TokenizerInfo.from_huggingface(hf, stop_token_ids=vocab.eos_ids)
        else:
            self.info = xgrammar.TokenizerInfo(
                vocab.tokens, xgrammar.VocabType.RAW, stop_token_ids=vocab.eos_ids
            )
        self.tokenizer_s = time.perf_counter() - t0
        self.batcher = xgrammar.BatchGrammarMatcher(max_threads=threads)
        self.compilers: dict[str, Any] = {}
        self.compiled: dict[str, Any] = {}

    def compile_cold(self, case: Case) -> float:
        comp = self.xgr.GrammarCompiler(self.info, max_threads=self.threads, cache_enabled=True)
        t0 = time.perf_counter()
        self.compiled[case.name] = case.xgr(comp)
        dt = time.perf_counter() - t0
        self.compilers[case.name] = comp
        return dt

    def compile_warm(self, case: Case) -> float:
        t0 = time.perf_counter()
        case.xgr(self.compilers[case.name])
        return time.perf_counter() - t0

    def clone_template(self, case: Case) -> float:
        t0 = time.perf_counter()
        self.xgr.GrammarMatcher(self.compiled[case.name])
        return time.perf_counter() - t0

    def new_matcher(self, case: Case) -> Any:
        return self.xgr.GrammarMatcher(self.compiled[case.name])

    def alloc(self, rows: int) -> tuple[Any, np.ndarray]:
        t = self.xgr.allocate_token_bitmask(rows, self.info.vocab_size)
        return t, t.numpy()  # shares memory

    def fill(self, m: Any, mask: Any) -> None:
        m.fill_next_token_bitmask(mask, 0)

    def consume(self, m: Any, tok: int) -> bool:
        return bool(m.accept_token(tok))

    def finished(self, m: Any) -> bool:
        return bool(m.is_terminated())

    def reset(self, m: Any) -> None:
        m.reset()

    def batch_fill(self, ms: list[Any], mask: Any) -> None:
        self.batcher.batch_fill_next_token_bitmask(ms, mask)

    def batch_consume(self, ms: list[Any], toks: list[int]) -> list[bool]:
        return self.xgr.BatchGrammarMatcher.batch_accept_token(ms, toks)


BACKENDS: dict[str, type[Backend]] = {"llguidance": LlgBackend, "xgrammar": XgrBackend}


# --------------------------------------------------------------------------------- driver


def _bit(mask_row: np.ndarray, tok: int) -> bool:
    return bool((int(mask_row[tok >> 5]) >> (tok & 31)) & 1)


def _stats_us(ns: list[int]) -> dict[str, float]:
    if not ns:
        return {"mean_us": math.nan, "median_us": math.nan, "p99_us": math.nan, "max_us": math.nan}
    a = np.asarray(ns, dtype=np.float64) / 1e3
    return {
        "mean_us": float(a.mean()),
        "median_us": float(np.median(a)),
        "p99_us": float(np.percentile(a, 99)),
        "max_us": float(a.max()),
    }


@dataclass
class Walk:
    mask_ns: list[int] = field(default_factory=list)
    first_mask_ns: list[int] = field(default_factory=list)
    consume_ns: list[int] = field(default_factory=list)
    mask_rejects: int = 0  # steps whose mask disallowed the (valid) next token
    consume_fails: int = 0  # steps where the matcher refused the token (walk ends there)
    special_leaks: int = 0  # steps whose mask allowed <|im_start|>
    unfinished: int = 0  # walks that did not end in the stopped state after EOS
    first_error: str = ""

    def note(self, msg: str) -> None:
        self.first_error = self.first_error or msg


def walk(be: Backend, case: Case, ids: list[int], reps: int) -> Walk:
    """Step through ``ids`` (valid output + EOS) ``reps`` times from fresh matchers. A token
    the mask wrongly excludes is still fed to the matcher (and counted), so the walk goes on
    when only the mask is at fault."""
    w = Walk()
    mask, view = be.alloc(1)
    row = view[0]
    im_start = be.vocab.im_start_id
    for _ in range(reps):
        m = be.new_matcher(case)
        ok = True
        for step, tok in enumerate(ids):
            t0 = time.perf_counter_ns()
            be.fill(m, mask)
            t1 = time.perf_counter_ns()
            (w.first_mask_ns if step == 0 else w.mask_ns).append(t1 - t0)
            if _bit(row, im_start):
                w.special_leaks += 1
            if not _bit(row, tok):
                w.mask_rejects += 1
                w.note(f"step {step}: token {tok} {be.vocab.tokens[tok]!r} masked out")
            t2 = time.perf_counter_ns()
            accepted = be.consume(m, tok)
            w.consume_ns.append(time.perf_counter_ns() - t2)
            if not accepted:
                w.consume_fails += 1
                w.note(f"step {step}: token {tok} {be.vocab.tokens[tok]!r} rejected by matcher")
                ok = False
                break
        if ok and not be.finished(m):
            w.unfinished += 1
            w.note("matcher not stopped after EOS")
    return w


def batch_walk(be: Backend, case: Case, ids: list[int], batch: int, steps: int) -> dict[str, Any]:
    """``batch`` matchers at staggered positions in the same walk, stepping together;
    one that has consumed EOS is reset and starts over."""
    ms = [be.new_matcher(case) for _ in range(batch)]
    n = len(ids)
    pos = []
    for i, m in enumerate(ms):
        off = (i * n) // batch
        for tok in ids[:off]:
            be.consume(m, tok)
        pos.append(off)
    mask, view = be.alloc(batch)
    fill_ns: list[int] = []
    consume_ns: list[int] = []
    rejects = fails = 0
    for _ in range(steps):
        t0 = time.perf_counter_ns()
        be.batch_fill(ms, mask)
        fill_ns.append(time.perf_counter_ns() - t0)
        toks = [ids[p] for p in pos]
        rejects += sum(not _bit(view[i], t) for i, t in enumerate(toks))
        t1 = time.perf_counter_ns()
        oks = be.batch_consume(ms, toks)
        consume_ns.append(time.perf_counter_ns() - t1)
        fails += sum(not ok for ok in oks)
        for i in range(batch):
            pos[i] += 1
            if pos[i] == n or not oks[i]:
                be.reset(ms[i])
                pos[i] = 0
    s = _stats_us(fill_ns)
    return {
        "batch": batch,
        "steps": steps,
        **{f"fill_{k}": v for k, v in s.items()},
        "fill_per_seq_mean_us": s["mean_us"] / batch,
        "consume_mean_us": float(np.mean(consume_ns)) / 1e3,
        "mask_rejects": rejects,
        "consume_fails": fails,
    }


def bench_one(be: Backend, case: Case, args: argparse.Namespace) -> dict[str, Any]:
    ids = [*be.vocab.encode(case.text), be.vocab.eos_ids[0]]
    cold = be.compile_cold(case)
    warm = [be.compile_warm(case) for _ in range(args.warm_reps)]
    clone = [be.clone_template(case) for _ in range(args.warm_reps)]
    reps = max(args.reps, math.ceil(args.min_steps / len(ids)))
    w = walk(be, case, ids, reps)
    r: dict[str, Any] = {
        "lib": be.name,
        "vocab": be.vocab.name,
        "grammar": case.name,
        "tokens": len(ids),
        "reps": reps,
        "compile_cold_ms": cold * 1e3,
        "compile_warm_ms": float(np.median(warm)) * 1e3,
        "matcher_new_us": float(np.median(clone)) * 1e6,
        "steps": len(w.mask_ns) + len(w.first_mask_ns),
        **_stats_us(w.mask_ns + w.first_mask_ns),
        "first_mask_mean_us": _stats_us(w.first_mask_ns)["mean_us"],
        "later_mask_mean_us": _stats_us(w.mask_ns)["mean_us"],
        "consume_mean_us": _stats_us(w.consume_ns)["mean_us"],
        "mask_rejects": w.mask_rejects,
        "consume_fails": w.consume_fails,
        "special_leaks": w.special_leaks,
        "unfinished": w.unfinished,
        "first_error": w.first_error,
    }
    if args.batch > 0:
        r["batched"] = batch_walk(be, case, ids, args.batch, args.batch_steps)
    return r


def machine_info(threads: int) -> dict[str, Any]:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = {}
    for pkg in (
        "llguidance",
        "xgrammar",
        "apache-tvm-ffi",
        "torch",
        "transformers",
        "tokenizers",
        "numpy",
    ):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "threads": threads,
        "versions": versions,
    }


def _f(x: float, nd: int = 1) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{nd}f}"


def print_report(
    info: dict[str, Any],
    setup: list[dict[str, Any]],
    rows: list[dict[str, Any]],
    grammars: dict[str, str],
    out: Any = sys.stdout,
) -> None:
    v = info["versions"]
    print(
        f"machine: {info['cpu'] or '?'}; {info['cpu_count']} CPUs "
        f"({info['cpus_usable']} usable); threads for batch/compile: {info['threads']}; "
        f"python {info['python']}; {info['platform']}",
        file=out,
    )
    print("versions: " + ", ".join(f"{k} {val}" for k, val in v.items()), file=out)
    print(f"total run time: {info['total_s']:.1f} s", file=out)
    print("grammars:", file=out)
    for name, what in grammars.items():
        print(f"  {name:<11} {what}", file=out)
    print("\ntokenizer setup (one-off per process):", file=out)
    for s in setup:
        print(
            f"  {s['lib']:<10} {s['vocab']:<9} vocab={s['vocab_size']:>6}  "
            f"{s['tokenizer_ms']:8.1f} ms",
            file=out,
        )
    hdr = (
        f"\n{'lib':<10} {'vocab':<9} {'grammar':<11} {'cold ms':>8} {'warm ms':>8} "
        f"{'new us':>7} {'steps':>5} {'mean':>7} {'median':>7} {'p99':>7} {'max':>7} "
        f"{'1st':>7} {'eat us':>6} {'rej':>4} {'fail':>4} {'leak':>4}"
    )
    print(hdr, file=out)
    print("-" * (len(hdr) - 1), file=out)
    for r in rows:
        if "error" in r:
            print(f"{r['lib']:<10} {r['vocab']:<9} {r['grammar']:<11} ERROR {r['error']}", file=out)
            continue
        print(
            f"{r['lib']:<10} {r['vocab']:<9} {r['grammar']:<11} {_f(r['compile_cold_ms'], 2):>8} "
            f"{_f(r['compile_warm_ms'], 2):>8} {_f(r['matcher_new_us']):>7} {r['steps']:>5} "
            f"{_f(r['mean_us']):>7} {_f(r['median_us']):>7} {_f(r['p99_us']):>7} "
            f"{_f(r['max_us']):>7} {_f(r['first_mask_mean_us']):>7} "
            f"{_f(r['consume_mean_us']):>6} {r['mask_rejects']:>4} {r['consume_fails']:>4} "
            f"{r['special_leaks']:>4}",
            file=out,
        )
    print(
        "cold/warm: compile of the grammar, first and again (xgrammar warm = cache hit; "
        "llguidance has no cache,\n  warm = a fresh LLMatcher). new us: per-request matcher "
        "(xgr GrammarMatcher(compiled); llg deep_copy).\n  mean..max: mask time per step in us "
        "over all steps of all walks; 1st: mean of the first mask of a walk;\n  eat us: "
        "consume one token; rej: steps whose mask excluded the valid next token;\n  fail: "
        "tokens the matcher refused (ends the walk); leak: masks allowing <|im_start|>.",
        file=out,
    )
    brows = [r for r in rows if "batched" in r]
    if brows:
        b0 = brows[0]["batched"]
        print(
            f"\nbatched: {b0['batch']} matchers at staggered positions, {b0['steps']} steps; "
            f"wall time of one batched mask fill",
            file=out,
        )
        hdr = (
            f"{'lib':<10} {'vocab':<9} {'grammar':<11} {'mean us':>8} {'median':>8} "
            f"{'p99':>8} {'per seq':>8} {'eat us':>8} {'rej':>4} {'fail':>4}"
        )
        print(hdr, file=out)
        print("-" * len(hdr), file=out)
        for r in brows:
            b = r["batched"]
            print(
                f"{r['lib']:<10} {r['vocab']:<9} {r['grammar']:<11} {_f(b['fill_mean_us']):>8} "
                f"{_f(b['fill_median_us']):>8} {_f(b['fill_p99_us']):>8} "
                f"{_f(b['fill_per_seq_mean_us']):>8} {_f(b['consume_mean_us']):>8} "
                f"{b['mask_rejects']:>4} {b['consume_fails']:>4}",
                file=out,
            )
    errs = [r for r in rows if r.get("first_error")]
    for r in errs:
        print(f"! {r['lib']} {r['vocab']} {r['grammar']}: {r['first_error']}", file=out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", type=Path, metavar="OUT", help="write all figures as JSON")
    p.add_argument("--libs", default="llguidance,xgrammar")
    p.add_argument("--vocabs", default="tiny2k,synth150k")
    p.add_argument("--grammars", default="json_object,json_schema,regex_email,choice5,tool_call")
    p.add_argument("--reps", type=int, default=10, help="walks per grammar (at least)")
    p.add_argument(
        "--min-steps",
        type=int,
        default=300,
        help="more walks for short outputs until this many masked steps",
    )
    p.add_argument("--warm-reps", type=int, default=5, help="repeat compiles for the warm figure")
    p.add_argument("--batch", type=int, default=32, help="matchers in the batched case (0: skip)")
    p.add_argument("--batch-steps", type=int, default=200)
    p.add_argument(
        "--threads",
        type=int,
        default=os.cpu_count() or 1,
        help="threads for LLExecutor / BatchGrammarMatcher / GrammarCompiler",
    )
    p.add_argument("--seed", type=int, default=20240501, help="seed of the synthetic vocabulary")
    a = p.parse_args(argv)

    libs = [s for s in a.libs.split(",") if s]
    vocabs = [s for s in a.vocabs.split(",") if s]
    cases = {c.name: c for c in _cases()}
    wanted = [s for s in a.grammars.split(",") if s]
    bad = (
        [s for s in libs if s not in BACKENDS]
        + [s for s in vocabs if s not in ("tiny2k", "synth150k")]
        + [s for s in wanted if s not in cases]
    )
    if bad:
        p.error(f"unknown: {', '.join(bad)}")

    t_start = time.perf_counter()
    info = machine_info(a.threads)
    setup: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    for vname in vocabs:
        vocab = load_tiny() if vname == "tiny2k" else load_synth(a.seed)
        print(
            f"[{time.perf_counter() - t_start:6.1f}s] vocab {vname}: {vocab.size} tokens "
            f"(built in {vocab.build_s:.2f}s)",
            file=sys.stderr,
        )
        for lib in libs:
            be = BACKENDS[lib](vocab, a.threads)
            setup.append(
                {
                    "lib": lib,
                    "vocab": vname,
                    "vocab_size": vocab.size,
                    "tokenizer_ms": be.tokenizer_s * 1e3,
                }
            )
            for gname in wanted:
                case = cases[gname]
                try:
                    r = bench_one(be, case, a)
                except Exception as e:  # report, keep going with the other cells
                    r = {
                        "lib": lib,
                        "vocab": vname,
                        "grammar": gname,
                        "error": f"{type(e).__name__}: {e}",
                    }
                rows.append(r)
                print(
                    f"[{time.perf_counter() - t_start:6.1f}s] {lib} {vname} {gname} done",
                    file=sys.stderr,
                )
    info["total_s"] = time.perf_counter() - t_start
    described = {c.name: c.what for c in cases.values() if c.name in wanted}
    print_report(info, setup, rows, described)
    if a.json:
        doc = {
            "machine": info,
            "tokenizers": setup,
            "results": rows,
            "grammars": described,
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
        }
        a.json.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
    dirty = any(
        "error" in r
        or r["mask_rejects"]
        or r["consume_fails"]
        or r["unfinished"]
        or r.get("batched", {}).get("mask_rejects")
        or r.get("batched", {}).get("consume_fails")
        for r in rows
    )
    return EXIT_VIOLATIONS if dirty else 0


if __name__ == "__main__":
    sys.exit(main())
