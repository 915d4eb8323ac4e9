"""Token constraints from JSON schemas and GBNF grammars (llguidance) on the tests' tiny tokenizer: masks,
forced tokens, rollback, EOS only where the structure ends, and the constraint as a transform of p."""

from __future__ import annotations

import random

import pytest
import torch
from conftest import TOKENIZER_EOS_ID, TOKENIZER_IM_END_ID, tiny_tokenizer
from reference_transforms import probabilities_reference

from exactspec.foundations.errors import InvalidArgument
from exactspec.foundations.grammar import GrammarCompiler, Structure
from exactspec.foundations.settings import SamplingSettings
from exactspec.foundations.transforms import greedy_ids, probabilities

TOKENIZER = tiny_tokenizer()
VOCAB = len(TOKENIZER) + 6  # a model's vocabulary may have rows past the tokenizer's
EOS = [TOKENIZER_EOS_ID, TOKENIZER_IM_END_ID]
SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "colour": {"enum": ["red", "green"]}},
    "required": ["ok", "colour"],
    "additionalProperties": False,
}
ANSWER = '{"ok": true, "colour": "green"}'


def compiler() -> GrammarCompiler:
    return GrammarCompiler.shared(TOKENIZER, VOCAB, EOS)


def encode(text: str) -> list[int]:
    return TOKENIZER.encode(text, add_special_tokens=False)


def allowed_ids(mask: torch.Tensor | None) -> set[int]:
    assert mask is not None
    return set(torch.nonzero(mask).flatten().tolist())


def test_the_schema_forces_its_keys_and_allows_eos_only_where_the_json_ends() -> None:
    row = compiler().compile(Structure.json_schema(SCHEMA)).for_row()
    assert (
        TOKENIZER.decode(row.forced([], 20)) == '{"ok":'
    )  # the space may merge with what follows (" f" is a token)
    assert TOKENIZER.decode(row.forced([], 3)) == '{"o'  # at most `limit`
    ids = encode(ANSWER)
    for end in range(len(ids)):
        mask = row.allowed(ids[:end], VOCAB)
        assert ids[end] in allowed_ids(mask)
        assert not allowed_ids(mask) & set(EOS)  # the object is not closed yet
        assert not allowed_ids(mask) & set(range(len(TOKENIZER), VOCAB))  # no id past the tokenizer
    assert allowed_ids(row.allowed(ids, VOCAB)) == set(EOS)
    assert row.forced(ids, 5) == []  # EOS is never forced
    after_true = encode('{"ok": true')
    assert TOKENIZER.decode(row.forced(after_true, 20)) == ', "colour": "'


def test_histories_that_leave_or_end_the_structure_are_unconstrained() -> None:
    row = compiler().compile(Structure.json_schema(SCHEMA)).for_row()
    assert row.allowed(encode('{"ok": maybe'), VOCAB) is None
    assert row.allowed([*encode(ANSWER), TOKENIZER_EOS_ID], VOCAB) is None
    assert row.allowed([*encode(ANSWER), TOKENIZER_EOS_ID, 5], VOCAB) is None
    # ...and the matcher is sound again for a history inside the structure.
    assert allowed_ids(row.allowed(encode(ANSWER), VOCAB)) == set(EOS)


def test_incremental_masks_equal_masks_from_a_fresh_matcher() -> None:
    """One matcher moved forward and back over random histories (accepted tokens, rejected drafts, other
    rows' prefixes) answers what a fresh matcher answers for each history."""
    compiled = compiler().compile(Structure.json_schema(SCHEMA))
    moving = compiled.for_row()
    answers = [encode(ANSWER), encode('{"ok": false, "colour": "red"}')]
    rng = random.Random(0)
    for _ in range(60):
        ids = rng.choice(answers)
        history = ids[: rng.randint(0, len(ids))]
        if rng.random() < 0.2:
            history = [*history, rng.randrange(len(TOKENIZER))]  # a draft token, maybe outside
        got, expected = moving.allowed(history, VOCAB), compiled.for_row().allowed(history, VOCAB)
        assert (got is None) == (expected is None)
        if got is not None:
            assert torch.equal(got, expected)
        assert moving.forced(history, 8) == compiled.for_row().forced(history, 8)


def test_a_gbnf_grammar_and_json_mode() -> None:
    row = compiler().compile(Structure.gbnf('root ::= "yes" | "no"')).for_row()
    assert {TOKENIZER.decode([t]) for t in allowed_ids(row.allowed([], VOCAB))} == {"y", "n"}
    assert allowed_ids(row.allowed(encode("yes"), VOCAB)) == set(EOS)
    anything = compiler().compile(Structure.json_object()).for_row()
    assert TOKENIZER.decode(anything.forced([], 5)) == "{"
    assert allowed_ids(anything.allowed(encode('{"a": [1, {}]}'), VOCAB)) == set(EOS)


@pytest.mark.parametrize(
    ("structure", "words"),
    [
        (lambda: Structure.json_schema({"type": "objekt"}), "objekt"),
        (lambda: Structure.json_schema({"type": "string", "pattern": "(("}), "not a 'regex'"),
        (lambda: Structure.json_schema({"type": "integer", "maxLength": -1}), "maxLength"),
        (lambda: Structure.json_schema("{not json"), "not valid JSON"),
        (lambda: Structure.json_schema({"$ref": "#/nowhere"}), "nowhere"),
        (lambda: Structure.gbnf("root ::= missing"), "missing"),
        (lambda: Structure.gbnf("  "), "empty"),
        # Languages with nothing in them.
        (lambda: Structure.gbnf("root ::= root"), "matches no text"),
        (lambda: Structure.gbnf("root ::= a\na ::= b\nb ::= a"), "matches no text"),
        (
            lambda: Structure.json_schema({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}),
            "no text",
        ),
        (lambda: Structure.json_schema({"$ref": "#"}), "matches no text"),
        # Valid, but past what the matcher takes: refused, never left unconstrained.
        (lambda: Structure.gbnf(alternatives(2100)), "too large or complex for the matcher"),
        (lambda: Structure.gbnf('root ::= "a"{100000}'), "too large or complex for the matcher"),
        # Past this server's own bounds.
        (lambda: Structure.json_schema({"properties": {f"p{i}": {} for i in range(15_000)}}), "100,000"),
        (lambda: Structure.json_schema({"enum": [f"v{i}" for i in range(100_000)]}), "100,000"),
        (lambda: Structure.json_schema({"description": "x" * 1_000_000}), "characters"),
        (lambda: Structure.gbnf(alternatives(50_000)), "characters"),
        (lambda: Structure.json_schema(nested(200)), "nests deeper than 64"),
        (lambda: Structure.json_schema({"x-guidance": {"whitespace_flexible": True}}), "x-guidance"),
        (lambda: Structure.json_schema({"items": {"x-guidance": {"lenient": True}}}), "x-guidance"),
    ],
)
def test_bad_schemas_and_grammars_raise_naming_the_problem(structure, words: str) -> None:
    with pytest.raises(InvalidArgument, match=words) as caught:
        compiler().compile(structure())
    assert caught.value.param in ("response_format", "grammar")
    message = str(caught.value)
    assert (
        "\n" not in message and len(message) < 400 and "backtrace" not in message and "<state>" not in message
    )


def alternatives(n: int) -> str:
    """A GBNF grammar of n alternatives: root ::= "w0" | "w1" | ..."""
    return "root ::= " + " | ".join(f'"w{i}"' for i in range(n))


def nested(levels: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


def test_a_property_named_x_guidance_is_a_name_not_an_option() -> None:
    schema = {"type": "object", "properties": {"x-guidance": {"type": "integer"}}, "required": ["x-guidance"]}
    row = compiler().compile(Structure.json_schema(schema)).for_row()
    assert TOKENIZER.decode(row.forced([], 20)).startswith('{"x-guidance":')


def test_a_large_valid_grammar_is_enforced_on_every_token() -> None:
    """1,500 alternatives (under the matcher's 2,000 items a row): every mask keeps to the language, and
    a walk through the masks only ever spells one of the words."""
    words = [f"w{i}" for i in range(1500)]
    row = compiler().compile(Structure.gbnf(alternatives(1500))).for_row()
    rng = random.Random(0)
    for _ in range(20):
        history: list[int] = []
        while True:
            mask = row.allowed(history, VOCAB)
            assert mask is not None and row.failure() is None
            choices = sorted(allowed_ids(mask))
            token = rng.choice(choices)
            if token in EOS:
                break
            history.append(token)
        assert TOKENIZER.decode(history) in words


def test_a_matcher_that_fails_deep_in_the_text_allows_eos_only_and_says_why() -> None:
    """A limit met past the compile's probe (20 free letters, more than it walks, then 2,100
    alternatives): from there the mask allows EOS only and failure() names the field."""
    grammar = 'root ::= [a-z]{20} "-" (' + alternatives(2100).removeprefix("root ::= ") + ")"
    row = compiler().compile(Structure.gbnf(grammar)).for_row()
    ids = encode("q" * 20 + "-")
    assert row.failure() is None and row.allowed(ids, VOCAB) is not None
    assert allowed_ids(row.allowed([*ids, *encode("w")], VOCAB)) == set(EOS)
    failure = row.failure()
    assert failure is not None and failure.param == "grammar" and "2000" in str(failure)
    assert row.forced(ids, 5) == []
    assert allowed_ids(row.allowed(ids, VOCAB)) == set(EOS)  # no way back: the row must end


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_the_constraint_is_a_transform_of_p_position_by_position(temperature: float) -> None:
    """p is zero outside each position's mask, the greedy row takes the masked argmax, and the fast path
    equals the reference bit for bit."""
    compiled = compiler().compile(Structure.json_schema(SCHEMA))
    ids = encode(ANSWER)
    prompt = [1, 2, 3]
    histories = [prompt + ids[:end] for end in range(len(ids) + 1)]
    starts = [len(prompt)] * len(histories)
    logits = torch.randn(
        len(histories), VOCAB, generator=torch.Generator().manual_seed(1), dtype=torch.float64
    )
    settings = SamplingSettings(temperature=temperature, constraint=compiled.for_row())
    p = probabilities(logits, settings, histories, prompt_lengths=starts)  # [N, V]
    reference = SamplingSettings(temperature=temperature, constraint=compiled.for_row())
    assert torch.equal(p, probabilities_reference(logits, reference, histories, starts))
    for n, history in enumerate(histories):
        mask = compiled.for_row().allowed(history[len(prompt) :], VOCAB)
        assert mask is not None
        assert p[n][~mask].abs().sum() == 0.0
        masked = logits[n].masked_fill(~mask, -torch.inf)
        if temperature == 0.0:
            assert p[n].argmax() == masked.argmax()
        else:
            assert torch.allclose(p[n], torch.softmax(masked / temperature, dim=-1))
    greedy = SamplingSettings(temperature=0.0, constraint=compiled.for_row())
    best = greedy_ids(logits, [greedy] * len(histories), histories, starts)  # [N]
    expected = [
        int(logits[n].masked_fill(~compiled.for_row().allowed(h[3:], VOCAB), -torch.inf).argmax())
        for n, h in enumerate(histories)
    ]
    assert best.tolist() == expected


def test_a_constraint_needs_the_positions_histories() -> None:
    settings = SamplingSettings(constraint=compiler().compile(Structure.json_object()).for_row())
    assert settings.reads_output and settings.uses_history and "constrained" in settings.describe()
    with pytest.raises(ValueError, match="history and one prompt length"):
        probabilities(torch.zeros(1, VOCAB), settings)
