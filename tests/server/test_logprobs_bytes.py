"""Chat logprobs' `bytes` by hand: each token's own bytes (`TokenBytes`) and the entries a content holds
(`ContentLogprobs`), on the tests' byte-level tokenizer, where "é" is two byte tokens."""

from __future__ import annotations

from conftest import TOKENIZER_EOS_ID, tiny_tokenizer

from exactspec.api.text import TokenBytes
from exactspec.decoding.logprobs import TokenLogprob
from exactspec.server.logprobs import ContentLogprobs

TOKENIZER = tiny_tokenizer()
E_ACUTE = TOKENIZER.encode("é")  # [0xC3 token, 0xA9 token]


def ids(text: str) -> list[int]:
    return TOKENIZER.encode(text)


def entries(tokens: list[int]) -> list[TokenLogprob]:
    return [TokenLogprob(token, -0.5) for token in tokens]


def test_token_bytes_are_each_tokens_own_bytes() -> None:
    own = TokenBytes(TOKENIZER)
    assert [own(t) for t in E_ACUTE] == [b"\xc3", b"\xa9"]
    assert own(ids(" f")[0]) == b" f" and own(ids("ret")[0]) == b"ret"
    assert own(TOKENIZER_EOS_ID) is None  # special: not in the text
    assert own.text(E_ACUTE[0]) == "\\xc3"
    tokens = ids("dé ret\nok")
    assert b"".join(own(t) for t in tokens) == "dé ret\nok".encode()


def test_a_split_character_is_released_whole_and_eos_is_dropped() -> None:
    content = ContentLogprobs(TOKENIZER)
    content.add(entries([*ids("a"), E_ACUTE[0]]))
    first = content.release(1)  # "a" shown; the half of "é" ends no character yet
    assert [data for _, data in first] == [b"a", b"\xc3"]
    content.add(entries([E_ACUTE[1], TOKENIZER_EOS_ID]))
    assert [data for _, data in content.release(2, final=True)] == [b"\xa9"]


def test_a_stop_cut_inside_a_token_keeps_the_part_the_content_holds() -> None:
    tokens = ids("ab ret")  # stop "e": the content is "ab r", the last token "ret" cut inside
    content = ContentLogprobs(TOKENIZER)
    content.add(entries(tokens))
    released = content.release(len("ab r"), final=True)
    assert b"".join(data for _, data in released) == b"ab r"
    assert released[-1][0].token == ids("ret")[0] and released[-1][1] == b"r"


def test_bytes_that_are_no_utf8_decode_to_the_contents_replacement_characters() -> None:
    tokens = [E_ACUTE[0], *ids("X"), E_ACUTE[1]]  # a lone lead byte, then a lone continuation byte
    text = TOKENIZER.decode(tokens)
    content = ContentLogprobs(TOKENIZER)
    content.add(entries(tokens))
    released = content.release(len(text), final=True)
    assert len(released) == 3 and b"".join(d for _, d in released).decode(errors="replace") == text
