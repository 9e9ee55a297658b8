"""Stop strings across arbitrary chunk boundaries, against a checker that keeps all the text."""

from __future__ import annotations

import random

import pytest

from izh_trio.frontend.stop import StopChecker


def _reference(pieces: list[str], stops: tuple[str, ...], include: bool
               ) -> tuple[list[str], str | None]:
    """The same contract done the plain way: search the whole text after every piece."""
    stops = tuple(s for s in stops if s)
    hold = 0 if include else max((len(s) for s in stops), default=1) - 1
    text, shown, out = "", 0, []
    for i, piece in enumerate(pieces):
        text += piece
        hits = [(text.find(s), s) for s in stops if s in text]
        if hits:
            idx, stop = min(hits)
            end = max(shown, idx + len(stop) if include else idx)
            out.append(text[shown:end])
            return out + [""] * (len(pieces) - i - 1), stop
        end = len(text) if i == len(pieces) - 1 else max(shown, len(text) - hold)
        out.append(text[shown:end])
        shown = end
    return out, None


def _run(pieces: list[str], stops: tuple[str, ...], include: bool
         ) -> tuple[list[str], str | None]:
    checker = StopChecker(stops, include)
    out = [checker.push(p, final=i == len(pieces) - 1) for i, p in enumerate(pieces)]
    return out, checker.matched


@pytest.mark.parametrize("seed", range(300))
def test_random_texts_and_splits_match_the_reference(seed: int) -> None:
    rng = random.Random(seed)
    alphabet = "ab\n."
    text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 400)))
    stops = tuple("".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 7)))
                  for _ in range(rng.randrange(0, 3)))
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randrange(0, 80)))
                  ) if len(text) > 1 else []
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    include = rng.random() < 0.3
    assert _run(pieces, stops, include) == _reference(pieces, stops, include)


def test_a_long_answer_keeps_only_its_tail() -> None:
    checker = StopChecker(("</answer>",))
    shown = "".join(checker.push("word ") for _ in range(10_000))
    assert len(checker._text) < 2 * len("</answer>") + len("word ")
    held = len("</answer>") - 1  # might be the start of the stop string: not shown yet
    assert shown == ("word " * 10_000)[:-held] and checker.matched is None
    # A stop string split over three pushes is still found, and never shown in part.
    parts = [checker.push("the end</an"), checker.push("sw"), checker.push("er> more")]
    assert shown + "".join(parts) == "word " * 10_000 + "the end"
    assert checker.matched == "</answer>"


def test_no_stop_strings_passes_pieces_through() -> None:
    checker = StopChecker(("",))
    assert [checker.push(p) for p in ("a", "", "bc")] == ["a", "", "bc"]
    assert checker.matched is None
