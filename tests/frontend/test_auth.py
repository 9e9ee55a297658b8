"""Bearer keys as bytes: parsing the header, comparing keys, and where keys come from."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from izh_trio.frontend.auth import authorized, bearer_token, key_bytes
from izh_trio.frontend.settings import Settings


@pytest.mark.parametrize(("headers", "token"), [
    ([(b"authorization", b"Bearer abc")], b"abc"),
    ([(b"Authorization", b"bearer  abc ")], b"abc"),
    ([(b"authorization", b"BEARER \xd0\xba\xd0\xbb")], b"\xd0\xba\xd0\xbb"),
    ([(b"authorization", b"Basic abc")], b""),
    ([(b"authorization", b"abc")], b""),
    ([(b"x-other", b"Bearer abc")], b""),
    ([(b"authorization", b"Basic x"), (b"authorization", b"Bearer abc")], b""),  # the first
    ([], b""),
    # Anthropic's clients send the key in x-api-key; a bearer token, when there is one, wins.
    ([(b"x-api-key", b"abc")], b"abc"),
    ([(b"X-Api-Key", b" abc ")], b"abc"),
    ([(b"x-api-key", b"abc"), (b"authorization", b"Bearer xyz")], b"xyz"),
    ([(b"authorization", b"Basic x"), (b"x-api-key", b"abc")], b"abc"),
    ([(b"x-api-key", b"")], b""),
])
def test_bearer_token(headers: list[tuple[bytes, bytes]], token: bytes) -> None:
    assert bearer_token(headers) == token


def test_keys_match_as_utf8_bytes() -> None:
    keys = key_bytes(["ключ", "plain"])
    assert keys == ("ключ".encode(), b"plain")
    assert authorized("ключ".encode(), keys)
    assert authorized(b"plain", keys)
    assert not authorized("ключ".encode().decode("latin-1").encode(), keys)  # encoded twice
    assert not authorized(b"", keys)
    assert not authorized(b"plai", keys)


def test_an_empty_key_authenticates_nobody() -> None:
    """``--api-key ""`` turns auth on; it must not let a request without a key through."""
    assert not authorized(b"", key_bytes([""]))


def test_a_key_that_is_not_utf8_is_matched_by_its_bytes() -> None:
    """Python decodes argv and the environment with surrogateescape: such a key is matched
    by exactly the bytes it was given as."""
    given = b"k\xff\xfe"
    keys = key_bytes([os.fsdecode(given)])
    assert authorized(given, keys)


def test_keys_from_the_environment_and_a_file(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys"
    keys_file.write_bytes("# ops\nclé-fichier  # a comment\n\n".encode())
    settings = Settings.from_env({"IZH_API_KEY": "ключ-env, second",
                                  "IZH_API_KEYS_FILE": str(keys_file)})
    keys = key_bytes(settings.all_api_keys())
    assert keys == ("ключ-env".encode(), b"second", "clé-fichier".encode())
