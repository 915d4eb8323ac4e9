"""Text around the token engine: stop strings and streaming (api.text), tokenizer agreement and
end-of-turn ids (models.tokenizers)."""

from __future__ import annotations

import pytest

from exactspec.api.text import StopStrings, TextStream
from exactspec.models.tokenizers import END_OF_TURN_TOKENS, check_tokenizers_compatible, end_of_generation_ids


class VocabTokenizer:
    """A fake tokenizer: token i is the string tokens[i]; decode concatenates."""

    def __init__(self, tokens: list[str], eos_token_id: int | None = None, special: set[str] = frozenset()):
        self.tokens = tokens
        self.eos_token_id = eos_token_id
        self.special = set(special)

    def get_vocab(self) -> dict[str, int]:
        return {token: index for index, token in enumerate(self.tokens)}

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        words = [self.tokens[i] for i in ids]
        if skip_special_tokens:
            words = [w for w in words if w not in self.special]
        return "".join(words)

    def ids(self, *words: str) -> list[int]:
        vocab = self.get_vocab()
        return [vocab[w] for w in words]


class CharTokenizer:
    """Token i is chr(i)."""

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(map(chr, ids))


class ByteTokenizer:
    """Token i is the byte i; an incomplete UTF-8 character decodes to U+FFFD (as HF byte-level BPE does)."""

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return bytes(ids).decode("utf-8", errors="replace")


def chars(text: str) -> list[int]:
    return [ord(c) for c in text]


# --- check_tokenizers_compatible ---------------------------------------------------------------

BASE = ["a", "b", "c", "d", "e", "f", "g", "h"]


def test_identical_tokenizers_are_compatible() -> None:
    check_tokenizers_compatible(VocabTokenizer(BASE), VocabTokenizer(list(BASE)))


def test_draft_vocabulary_may_be_a_prefix_of_the_targets() -> None:
    """Qwen2.5: the draft has fewer rows than the target; shared ids agree."""
    check_tokenizers_compatible(VocabTokenizer([*BASE, "<extra>"]), VocabTokenizer(BASE))


def test_disagreeing_id_names_the_first_mismatch() -> None:
    draft = list(BASE)
    draft[3], draft[6] = "X", "Y"
    with pytest.raises(ValueError, match=r"token id 3\b") as error:
        check_tokenizers_compatible(VocabTokenizer(BASE), VocabTokenizer(draft))
    assert "'d'" in str(error.value) and "'X'" in str(error.value)


def test_draft_id_missing_in_target_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"id 8 \('extra'\) that the target lacks"):
        check_tokenizers_compatible(VocabTokenizer(BASE), VocabTokenizer([*BASE, "extra", "more"]))


def test_compatibility_with_real_tokenizers() -> None:
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")

    def build(words: list[str]) -> object:
        backend = tokenizers.Tokenizer(
            tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token=words[0])
        )
        backend.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
        return transformers.PreTrainedTokenizerFast(tokenizer_object=backend)

    words = ["[UNK]", "def", "return", "(", ")", ":"]
    check_tokenizers_compatible(build(words), build(words))
    swapped = [words[0], words[2], words[1], *words[3:]]
    with pytest.raises(ValueError, match="token id 1"):
        check_tokenizers_compatible(build(words), build(swapped))


# --- end_of_generation_ids ---------------------------------------------------------------------


def test_end_of_generation_ids_collects_eos_and_end_of_turn_tokens() -> None:
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "x", "y"]
    tokenizer = VocabTokenizer(tokens, eos_token_id=0)
    assert end_of_generation_ids(tokenizer, model_ids=[4]) == {0, 2, 4}


def test_end_of_generation_ids_picks_each_known_end_of_turn_token() -> None:
    tokens = ["x", *END_OF_TURN_TOKENS, "<|start_header_id|>", "<start_of_turn>"]
    ids = end_of_generation_ids(VocabTokenizer(tokens))
    assert ids == set(range(1, 1 + len(END_OF_TURN_TOKENS)))
    assert {"<|im_end|>", "<|eot_id|>", "<end_of_turn>"} <= set(END_OF_TURN_TOKENS)


def test_end_of_generation_ids_without_any_known_token() -> None:
    assert end_of_generation_ids(VocabTokenizer(["a", "b"]), model_ids=(1,)) == {1}
    assert end_of_generation_ids(VocabTokenizer(["a", "b"])) == frozenset()


# --- StopStrings -------------------------------------------------------------------------------


def test_stop_keeps_tokens_through_the_one_that_completes_the_stop_string() -> None:
    stop = StopStrings(CharTokenizer(), ["\n\n"])
    generated = chars("abc\n\nxyz")
    assert stop(0, generated) == 5
    assert stop.cut_text(CharTokenizer().decode(generated[:5])) == "abc"


def test_no_stop_string_means_go_on() -> None:
    stop = StopStrings(CharTokenizer(), ["STOP"])
    assert stop(0, chars("no stop here, STO")) is None
    assert stop.cut_text("no stop") == "no stop"
    assert stop.find("no stop") is None


def test_stop_string_spanning_tokens() -> None:
    tokenizer = VocabTokenizer(["foo", " ba", "r", "baz", " end"])
    stop = StopStrings(tokenizer, ["bar"])
    generated = tokenizer.ids("foo", " ba", "r", "baz", " end")
    assert stop(0, generated) == 3  # "ba" + "r": the token "r" completes it
    assert stop.cut_text(tokenizer.decode(generated[:3])) == "foo "


def test_stop_string_inside_one_token() -> None:
    tokenizer = VocabTokenizer(["x", "a<END>b", "y"])
    stop = StopStrings(tokenizer, ["<END>"])
    assert stop(0, tokenizer.ids("x", "a<END>b", "y")) == 2
    assert stop.cut_text("xa<END>b") == "xa"


def test_earliest_stop_string_wins() -> None:
    stop = StopStrings(CharTokenizer(), ["STOP", "END", "\n"])
    text = "a END b STOP\n"
    assert stop.find(text) == 2
    assert stop(0, chars(text)) == len("a END")
    assert stop.cut_text(text) == "a "


def test_stop_is_found_across_rounds() -> None:
    stop = StopStrings(CharTokenizer(), ["\n\n"])
    assert stop(0, chars("ab")) is None
    assert stop(0, chars("ab\n")) is None
    assert stop(0, chars("ab\n\ncd")) == 4


def test_stop_state_is_per_row() -> None:
    """Row 0 having checked many tokens must not make row 1 skip its own early stop."""
    stop = StopStrings(CharTokenizer(), ["\n\n"])
    assert stop(0, chars("abcdefgh")) is None
    assert stop(1, chars("x\n\nyyyyyyy")) == 3
    assert stop(0, chars("abcdefgh\n\n")) == 10


def test_stop_skips_special_tokens() -> None:
    tokenizer = VocabTokenizer(["a", "<|im_end|>", "b"], special={"<|im_end|>"})
    stop = StopStrings(tokenizer, ["ab"])
    assert stop(0, tokenizer.ids("a", "<|im_end|>", "b")) == 3


def test_empty_stop_string_is_rejected() -> None:
    with pytest.raises(ValueError, match="empty"):
        StopStrings(CharTokenizer(), ["ok", ""])


def test_holdback_counts_a_trailing_stop_prefix() -> None:
    stop = StopStrings(CharTokenizer(), ["\n\n", "STOP"])
    assert stop.holdback("abc\n") == 1
    assert stop.holdback("abc ST") == 2
    assert stop.holdback("abc") == 0
    assert stop.holdback("") == 0


# --- TextStream ---------------------------------------------------------------------------------


def _stream_all(stream: TextStream, generated: list[int], steps: list[int]) -> list[str]:
    """Deltas after each growth of `generated` to the lengths in `steps` (the last one final)."""
    return [stream.update(generated[:n], final=i == len(steps) - 1) for i, n in enumerate(steps)]


def test_stream_without_stop_shows_everything_at_once() -> None:
    stream = TextStream(CharTokenizer())
    assert stream.update(chars("ab")) == "ab"
    assert stream.update(chars("abcd")) == "cd"
    assert stream.update(chars("abcd"), final=True) == ""


def test_stream_holds_back_a_possible_stop_prefix() -> None:
    stream = TextStream(CharTokenizer(), StopStrings(CharTokenizer(), ["END"]))
    assert stream.update(chars("hello E")) == "hello "
    assert stream.update(chars("hello EN")) == ""
    assert stream.update(chars("hello ENX")) == "ENX"  # not a stop after all: shown
    assert stream.update(chars("hello ENX E")) == " "
    assert stream.update(chars("hello ENX END tail"), final=True) == ""


def test_stream_holds_back_an_incomplete_utf8_character() -> None:
    stream = TextStream(ByteTokenizer())
    data = list("hé😀!".encode())  # h, 2-byte é, 4-byte emoji, !
    deltas = _stream_all(stream, data, list(range(1, len(data) + 1)))
    assert "\ufffd" not in "".join(deltas)
    assert "".join(deltas) == "hé😀!"
    assert deltas[:4] == ["h", "", "é", ""]


def test_final_flush_shows_the_held_back_tail() -> None:
    stream = TextStream(CharTokenizer(), StopStrings(CharTokenizer(), ["END"]))
    assert stream.update(chars("abE")) == "ab"
    assert stream.update(chars("abEN"), final=True) == "EN"  # generation ended: no stop can follow

    stream = TextStream(ByteTokenizer())
    assert stream.update([104, 0xC3]) == "h"
    assert stream.update([104, 0xC3], final=True) == "\ufffd"  # a truncated character stays visible


def test_stream_deltas_concatenate_to_the_cut_text() -> None:
    tokenizer = VocabTokenizer(["de", "f f", "(x", "):", "\n", "\n ", "  r", "et"])
    stop = StopStrings(tokenizer, ["\n\n"])
    generated = [0, 1, 2, 3, 4, 5, 6, 7]
    stream = TextStream(tokenizer, stop)
    deltas = _stream_all(stream, generated, [1, 3, 5, 6, 8])
    assert "".join(deltas) == stop.cut_text(tokenizer.decode(generated)) == "def f(x):"
