"""Big inputs' pieces: the size bound, the offload to worker threads, the long-text paths."""

from __future__ import annotations

import gc
import threading
import unicodedata
import weakref
from collections.abc import Callable
from pathlib import Path

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers
from tokenizers.models import BPE, Unigram, WordPiece

from izh_trio.frontend.errors import APIError
from izh_trio.frontend.offload import INLINE_CHARS, WORKER_THREADS, Offload, size_of
from izh_trio.frontend.prompt_size import COMPOSE_SHRINK, PromptSize, message_text
from izh_trio.frontend.tokenizer import ModelTokenizer


@pytest.fixture(scope="module")
def tok(tiny_dir: Path) -> ModelTokenizer:
    return ModelTokenizer(tiny_dir)


@pytest.fixture(scope="module")
def size(tok: ModelTokenizer) -> PromptSize:
    return PromptSize.of(tok.tokenizer)


# ------------------------------------------------------------------ the size bound


def test_the_bound_is_the_longest_token(tok: ModelTokenizer, size: PromptSize) -> None:
    vocab = tok.tokenizer.get_vocab(with_added_tokens=True)
    assert size.chars_per_token == max(map(len, vocab))
    # NFC: ASCII never composes; other text may, 4 characters into 1 at most.
    assert (size.shrink.ascii, size.shrink.any) == (1.0, COMPOSE_SHRINK)
    most = 100 * size.chars_per_token
    size.check("a" * most, 100, param="prompt")
    with pytest.raises(APIError) as exc:
        size.check("a" * (most + 1), 100, param="prompt")
    assert exc.value.status == 400 and exc.value.code == "context_length_exceeded"
    assert exc.value.param == "prompt"
    size.check("é" * (most * COMPOSE_SHRINK), 100, param="prompt")
    with pytest.raises(APIError):
        size.check("é" * (most * COMPOSE_SHRINK + 1), 100, param="prompt")


def _worst_cases(tok: ModelTokenizer) -> list[str]:
    """Texts that pack the most characters into each token."""
    vocab = tok.tokenizer.get_vocab(with_added_tokens=True)
    longest = sorted(vocab, key=len)[-20:]
    decoded = [tok.tokenizer.decode([vocab[t]], skip_special_tokens=False) for t in longest]
    hangul = "".join(unicodedata.normalize("NFD", chr(c)) for c in range(0xAC00, 0xAC00 + 500))
    greek = unicodedata.normalize("NFD", "\u1f82") * 1000  # 4 characters, composed into 1
    return [*(d * 200 for d in decoded), hangul, greek, "<|im_start|>" * 300]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([
    "a", " ", "=", "================================", "\n", "é", "e\u0301", "\u1100\u1161",
    "<|im_start|>", "<think>", "🙂", "漢", "\u0345", "\u1f82"]), max_size=300).map("".join))
def test_the_bound_never_refuses_a_prompt_that_fits(tok: ModelTokenizer, size: PromptSize,
                                                    text: str) -> None:
    ids = tok.encode(text, add_special_tokens=True)
    size.check(text, max(len(ids), 1), param="prompt")  # a limit it fits exactly


def test_the_worst_cases_fit_their_bound(tok: ModelTokenizer, size: PromptSize) -> None:
    for text in _worst_cases(tok):
        for special in (False, True):
            size.check(text, len(tok.encode(text, add_special_tokens=special)), param="p")


def _tokenizer(model: object, *, normalizer: object = None,
               pre_tokenizer: object = None) -> Tokenizer:
    t = Tokenizer(model)
    if normalizer is not None:
        t.normalizer = normalizer
    if pre_tokenizer is not None:
        t.pre_tokenizer = pre_tokenizer
    return t


def _bpe(**kwargs: object) -> BPE:
    return BPE(vocab={"<unk>": 0, "a": 1, "b": 2, "ab": 3, "▁": 4}, merges=[("a", "b")],
               **kwargs)


@pytest.mark.parametrize(("tokenizer", "bounded"), [
    (_tokenizer(WordPiece({"[UNK]": 0, "a": 1, "##b": 2}, unk_token="[UNK]"),
                normalizer=normalizers.BertNormalizer(),
                pre_tokenizer=pre_tokenizers.BertPreTokenizer()), False),
    (_tokenizer(_bpe(), pre_tokenizer=pre_tokenizers.Whitespace()), False),
    (_tokenizer(_bpe(unk_token="<unk>", fuse_unk=True)), False),
    (_tokenizer(_bpe(), normalizer=normalizers.Replace(Regex(r"\s+"), " ")), False),
    (_tokenizer(_bpe(), normalizer=normalizers.Strip()), False),
    (_tokenizer(_bpe(), pre_tokenizer=pre_tokenizers.Split(" ", "removed")), False),
    (_tokenizer(Unigram([("<unk>", 0.0), ("a", -1.0)], unk_id=0)), False),
    (_tokenizer(_bpe(byte_fallback=True), normalizer=normalizers.Sequence(
        [normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])), True),
    (_tokenizer(_bpe(), normalizer=normalizers.NFKC(),
                pre_tokenizer=pre_tokenizers.Metaspace()), True),
    (_tokenizer(Unigram([("<unk>", 0.0), ("a", -1.0)], unk_id=0, byte_fallback=True)), True),
], ids=["bert", "whitespace", "fused-unk", "regex-replace", "strip", "split-removed",
        "unigram-unk", "sentencepiece-like", "nfkc-metaspace", "unigram-bytes"])
def test_no_bound_where_the_tokenizer_may_drop_text(tokenizer: Tokenizer,
                                                    bounded: bool) -> None:
    """Where text can vanish (whitespace splitting, cleaning, one [UNK] for a run), a long
    text may be few tokens: no size proves anything, and nothing is refused by size."""
    tokenizer.decoder = decoders.ByteLevel()
    size = PromptSize.of(tokenizer)
    assert (size.chars_per_token is not None) == bounded
    if not bounded:
        size.check(" " * 10_000_000, 1, param="prompt")


@pytest.mark.parametrize(("normalizer", "shrink"), [
    (normalizers.NFC(), (1.0, COMPOSE_SHRINK)),
    (normalizers.Sequence([normalizers.NFKC(), normalizers.Replace("ab", "c")]),
     (2.0, 2.0 * COMPOSE_SHRINK)),
    # Once ASCII text was given something else, composition may shrink it too.
    (normalizers.Sequence([normalizers.Prepend("▁"), normalizers.NFC()]),
     (COMPOSE_SHRINK, COMPOSE_SHRINK)),
    (normalizers.Sequence([normalizers.Lowercase(), normalizers.NFD()]), (1.0, 1.0)),
])
def test_normalizers_shrink_text_by_at_most(normalizer: object,
                                            shrink: tuple[float, float]) -> None:
    size = PromptSize.of(_tokenizer(_bpe(), normalizer=normalizer))
    assert (size.shrink.ascii, size.shrink.any) == shrink


def test_message_text_counts_what_any_template_renders() -> None:
    messages = [
        {"role": "system", "content": "  sys  "},
        {"role": "user", "content": [{"type": "text", "text": "ab"}, {"type": "image"},
                                     {"type": "text", "text": " é "}]},
        {"role": "assistant", "content": "xyz", "reasoning_content": "not counted"},
        {"role": "tool", "content": None},
        "not a message",
        {"role": "user", "content": [1, "x", {"text": 3}]},
    ]
    assert message_text(messages) == (3 + 2 + 1 + 3, False)
    assert message_text([{"role": "user", "content": "abc"}]) == (3, True)
    assert message_text("nonsense") == (0, True)


# ------------------------------------------------------------------ sizes and offloading


def test_size_of_counts_text_and_items_until_the_cap() -> None:
    assert size_of("abc") == 3
    assert size_of({"role": "user", "content": "hi"}) == 2 * 16 + 4 + 4 + 7 + 2
    assert size_of([None, 1, True]) == 3 * 16 + 3
    assert size_of(("a", ["b", {"c": "d"}])) == 2 * 16 + 1 + 2 * 16 + 1 + 16 + 2
    huge = [{"role": "user", "content": "x"}] * 1_000_000
    assert INLINE_CHARS < size_of(huge) < 20_000_000  # counted, not walked item by item


@pytest.mark.timing
async def test_small_work_runs_inline_and_big_work_in_a_bounded_pool() -> None:
    offload = Offload()
    loop_thread = threading.get_ident()
    assert await offload.run(threading.get_ident, size=INLINE_CHARS) == loop_thread
    assert await offload.run(threading.get_ident, size=INLINE_CHARS + 1) != loop_thread

    running, most = 0, 0
    changed = threading.Condition()

    def work() -> None:
        # Each job waits until the pool has run WORKER_THREADS at once (a state: a fixed
        # pause would need the second thread to start within it), then lingers so that a
        # pool with more threads would show more.
        nonlocal running, most
        with changed:
            running += 1
            most = max(most, running)
            changed.notify_all()
            changed.wait_for(lambda: most >= WORKER_THREADS, timeout=30)
        threading.Event().wait(0.02)
        with changed:
            running -= 1

    async with trio.open_nursery() as nursery:
        for _ in range(8):
            nursery.start_soon(lambda: offload.run(work, size=10 * INLINE_CHARS))
    assert most == WORKER_THREADS


class _Big:
    """Stands for a request's big text: what must not outlive the failure."""


def _failing_work() -> tuple[Callable[[], None], weakref.ref[_Big]]:
    big = _Big()

    def work() -> None:
        assert big is not None
        raise APIError(400, "too long", param="prompt")

    return work, weakref.ref(big)


async def test_a_failure_in_a_worker_is_raised_and_holds_nothing() -> None:
    offload = Offload()
    work, alive = _failing_work()
    gc.disable()  # a reference cycle would keep the big object until the collector ran
    try:
        with pytest.raises(APIError, match="too long"):
            await offload.run(work, size=10 * INLINE_CHARS)
        del work
        assert alive() is None
    finally:
        gc.enable()


# ------------------------------------------------------------------ long texts


def test_long_texts_encode_and_decode_as_short_ones_do(tok: ModelTokenizer) -> None:
    """Long texts take the tokenizer's batch calls (they release the GIL): same ids, text."""
    piece = ("Hello, <|im_start|>world!\n<think>é 漢字 🙂 x\u0301 " * 60)
    assert len(piece) > 2048
    for special in (False, True):
        ids = tok.encode(piece, add_special_tokens=special)
        assert ids == tok.tokenizer.encode(piece, add_special_tokens=special).ids
        assert len(ids) > 1024
        for skip in (False, True):
            assert tok.decode(ids, skip_special_tokens=skip) == tok.tokenizer.decode(
                ids, skip_special_tokens=skip)
