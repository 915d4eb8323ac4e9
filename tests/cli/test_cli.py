"""The command line: exit codes and messages of `verify` and `generate` (tiny models saved to disk)."""

from __future__ import annotations

import io
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
from conftest import TOKENIZER_EOS_ID, TOKENIZER_VOCAB, tiny_causal_lm, tiny_tokenizer

from exactspec.checking.grid import ExactCase
from exactspec.cli.common import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from exactspec.cli.main import main
from exactspec.decoding.strategy import Strategy
from exactspec.foundations.settings import SamplingSettings

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

PROMPT = "def f(x):"


def run(argv: Sequence[str]) -> int:
    """main()'s exit code, whether returned or raised by argparse (SystemExit)."""
    try:
        return main(list(argv))
    except SystemExit as exit_:
        return int(exit_.code or 0)


def assert_one_line_error(err: str, *fragments: str) -> None:
    """stderr holds exactly one error line (argparse may add its usage lines), naming every fragment."""
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1, err
    for fragment in fragments:
        assert fragment in errors[0], err


@pytest.fixture(autouse=True)
def no_default_pair(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test may fetch the built-in pair (~1.6 GB): every test names its models."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a CLI test tried to fetch the default pair")

    monkeypatch.setattr("exactspec.models.loading.ensure_parted_model", refuse)


# --- verify --------------------------------------------------------------------------------------


# A small grid for the command's own part: the grid's cases are checked by the tests that own them
# (tests/conftest.py `grid_owner`: every case `verify --quick` runs, each once per suite).
SMALL_GRID = [
    ExactCase("V=2 n=3", 2, 2, 3),
    ExactCase(
        "block T=1.7",
        3,
        2,
        2,
        SamplingSettings(temperature=1.7),
        strategy=Strategy("model", verifier="block", adaptive_gamma=False),
    ),
    ExactCase("V=5 n=3 (not quick)", 5, 2, 3),
]


def test_verify_quick(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """--quick runs the quick cases of the grid, a table row each, then the worst case; exit 0."""
    monkeypatch.setattr("exactspec.checking.grid.exact_grid", lambda: SMALL_GRID)
    assert run(["verify", "--quick", "--no-progress"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "worst case" in out and "PASS: 0 of 2 cases failed" in out and "FAIL" not in out
    rows = [line.split()[:2] for line in out.splitlines() if line.startswith(("V=", "block"))]
    assert rows == [["V=2", "n=3"], ["block", "T=1.7"]]  # in grid order; the big case left out


def test_verify_fails_when_a_case_is_not_exact(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wrong coupled rule (a miss emits the draft's token, not the target's draw) is a FAIL row and
    exit 1."""
    from exactspec.verifiers.token import _Block

    coupled = _Block.coupled

    def keeps_the_draft(block: _Block, p, draft_tokens, active, i) -> None:  # type: ignore[no-untyped-def]
        coupled(block, p, draft_tokens, active, i)
        block.tokens[active, i] = draft_tokens[active, i]

    monkeypatch.setattr("exactspec.checking.grid.exact_grid", lambda: SMALL_GRID[:1])
    monkeypatch.setattr(_Block, "coupled", keeps_the_draft)
    assert run(["verify", "--quick", "--no-progress"]) == EXIT_FAILED
    out = capsys.readouterr().out
    assert "FAIL: 1 of 1 cases failed" in out
    assert [line for line in out.splitlines() if line.startswith("V=2 n=3")][0].endswith("FAIL")


def test_verify_statistical(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["verify", "--statistical", "--samples", "2000", "--vocab", "200", "--no-progress"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "PASS at significance" in out


def test_verify_statistical_rejects_a_tiny_vocabulary(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["verify", "--statistical", "--vocab", "1", "--no-progress"]) == EXIT_USAGE
    assert_one_line_error(capsys.readouterr().err, "--vocab must be >= 2")


def test_no_command_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert run([]) == EXIT_USAGE
    assert "verify" in capsys.readouterr().out


# --- generate: tiny models in folders ------------------------------------------------------------


def save_tiny(folder: Path, seed: int) -> Path:
    model = tiny_causal_lm(
        vocab_size=len(TOKENIZER_VOCAB),
        seed=seed,
        initializer_range=0.2,
        eos_token_id=TOKENIZER_EOS_ID,
        tie_word_embeddings=False,
    )
    model.save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """(target folder, draft folder)."""
    root = tmp_path_factory.mktemp("cli-models")
    return str(save_tiny(root / "target", 0)), str(save_tiny(root / "draft", 1))


def generate_args(models: tuple[str, str], *extra: str) -> list[str]:
    """`generate` on the tiny models with dense weights.

    Named weights, because `--backend auto` (the default) times each candidate for a (target, draft)
    pair and runs the fastest: on these tiny models "hf bf16" and "hf int4" both take about 1.2 ms,
    and --plain (no draft) is timed apart from the pair, so a plain run and a speculative run could
    get different weights and so different greedy tokens (4 tests failed by that coin).
    """
    target, draft = models
    return [
        "generate",
        "--target",
        target,
        "--draft",
        draft,
        "--weights",
        "bf16",
        "--no-progress",
        "--max-new-tokens",
        "8",
        *extra,
    ]


def json_output(capsys: pytest.CaptureFixture[str]) -> dict:
    out = capsys.readouterr().out
    lines = out.strip().splitlines()
    assert len(lines) == 1, out
    return json.loads(lines[0])


def test_generate_json(models: tuple[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    assert run([*generate_args(models, "--json", "--gamma", "3", "--fixed-gamma"), PROMPT]) == EXIT_OK
    result = json_output(capsys)
    assert {"text", "token_ids", "finish_reason", "statistics"} <= set(result)
    assert isinstance(result["text"], str)
    assert 1 <= len(result["token_ids"]) <= 8
    assert result["finish_reason"] in ("eos", "length", "stop")
    assert result["gamma"] == 3
    assert result["statistics"]["emitted_tokens"] == len(result["token_ids"])
    assert result["statistics"]["proposed_tokens"] > 0


def test_generate_plain_json_equals_greedy_speculative(
    models: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """The default temperature is 0: --plain and speculative give the same tokens."""
    assert run([*generate_args(models, "--json", "--plain"), PROMPT]) == EXIT_OK
    plain = json_output(capsys)
    assert plain["gamma"] == 0 and plain["statistics"]["proposed_tokens"] == 0
    assert run([*generate_args(models, "--json"), PROMPT]) == EXIT_OK
    speculative = json_output(capsys)
    assert speculative["token_ids"] == plain["token_ids"]
    assert speculative["settings"] == plain["settings"] == "greedy"


def test_generate_streams_text_and_a_summary(
    models: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert run([*generate_args(models, "--temperature", "0.8", "--seed", "3"), PROMPT]) == EXIT_OK
    streamed = capsys.readouterr()
    assert run([*generate_args(models, "--temperature", "0.8", "--seed", "3", "--json"), PROMPT]) == EXIT_OK
    assert streamed.out == json_output(capsys)["text"] + "\n"
    assert "[exactspec]" in streamed.err and "finish:" in streamed.err and "Traceback" not in streamed.err


def test_a_planned_runs_summary_says_how_often_it_drafted_and_how_far_off_its_predictions_were(
    models: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """The defaults plan gamma from predicted round times: the summary counts the drafting rounds and gives
    the median |predicted / measured - 1| of the round times (the values are this machine's timings)."""
    import re

    assert run([*generate_args(models, "--drafter", "suffix", "--draft", "none"), PROMPT]) == EXIT_OK
    last = capsys.readouterr().err.strip().splitlines()[-1]
    found = re.search(r"drafted in (\d+) of (\d+) rounds, round times (\d+)% off their predictions", last)
    assert found and int(found[1]) <= int(found[2]), last


def test_compare_plain_ends_the_summary_with_the_speedup_and_identical_tokens(
    models: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Greedy: the speculative tokens are plain decoding's, measured on the same prompt in the same run,
    and the summary's one last line says so with the speed against it (and --json carries the same)."""
    argv = [*generate_args(models, "--gamma", "3", "--fixed-gamma", "--compare-plain"), PROMPT]
    assert run(argv) == EXIT_OK
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "tokens/round" in last and "x plain decoding's" in last
    assert "tokens identical to plain decoding's" in last
    assert run([*argv[:-1], "--json", PROMPT]) == EXIT_OK
    result = json_output(capsys)
    assert result["plain"]["identical"] and result["plain"]["token_ids"] == result["token_ids"]
    assert result["plain"]["tokens_per_second"] > 0


def test_comparison_names_where_the_tokens_first_differ() -> None:
    from exactspec.cli.generate import PlainRun, _comparison
    from exactspec.foundations.metrics import DecodeMetrics
    from exactspec.foundations.settings import SamplingSettings

    metrics = DecodeMetrics(emitted_tokens=4, total_seconds=1.0)
    line = _comparison(PlainRun([1, 2, 5, 6], 2.0), metrics, [1, 2, 3, 4], SamplingSettings(temperature=0.0))
    assert line.startswith("2.00x plain decoding's 2.0 tokens/s on this prompt")
    assert line.endswith(
        "tokens differ from plain decoding's from token 3 (a wider pass's float rounding: docs/numerics.md)"
    )
    sampled = SamplingSettings(temperature=0.7)
    drawn = _comparison(PlainRun([1, 2], 2.0), metrics, [1, 3], sampled, keeps_plain_tokens=False)
    assert drawn.endswith("from token 2 (sampled with drafts drawn from q: the same law, other draws)")


def test_generate_prompt_from_file(
    models: tuple[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prompt_file = tmp_path / "prompt.txt"
    prompt_file.write_text(PROMPT, encoding="utf-8")
    assert run(generate_args(models, "--json", "--prompt-file", str(prompt_file))) == EXIT_OK
    from_file = json_output(capsys)
    assert run([*generate_args(models, "--json"), PROMPT]) == EXIT_OK
    from_argument = json_output(capsys)
    for key in ("text", "token_ids", "finish_reason", "prompt_tokens"):
        assert from_file[key] == from_argument[key]


@pytest.mark.parametrize("dash", [True, False], ids=["dash", "pipe"])
def test_generate_prompt_from_stdin(
    models: tuple[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], dash: bool
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO(PROMPT))
    assert run(generate_args(models, "--json", *(["-"] if dash else []))) == EXIT_OK
    result = json_output(capsys)
    assert result["prompt_tokens"] == 6  # def, Ġf, (, x, ), :


# --- generate: usage errors exit 2 with one line and no traceback -------------------------------


def test_missing_model_path(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["generate", "--target", "/nonexistent", "--no-progress", PROMPT]) == EXIT_USAGE
    assert_one_line_error(
        capsys.readouterr().err, "exactspec generate: error:", "/nonexistent does not exist"
    )


def test_gguf_file_that_is_not_gguf(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    junk = tmp_path / "model.gguf"
    junk.write_bytes(b"this is not a GGUF file\n" * 10)
    assert run(["generate", "--target", str(junk), "--no-progress", PROMPT]) == EXIT_USAGE
    assert_one_line_error(capsys.readouterr().err, "is not a GGUF file")


def test_bad_draft_path(models: tuple[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    args = ["generate", "--target", models[0], "--draft", "/nonexistent/draft", "--no-progress", PROMPT]
    assert run(args) == EXIT_USAGE
    assert_one_line_error(capsys.readouterr().err, "/nonexistent/draft does not exist")


@pytest.mark.parametrize("prompt", ["", "   \n\t"])
def test_empty_prompt(models: tuple[str, str], capsys: pytest.CaptureFixture[str], prompt: str) -> None:
    assert run([*generate_args(models), prompt]) == EXIT_USAGE
    assert_one_line_error(capsys.readouterr().err, "the prompt is empty")


def test_empty_prompt_file(
    models: tuple[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    assert run(generate_args(models, "--prompt-file", str(empty))) == EXIT_USAGE
    assert_one_line_error(capsys.readouterr().err, "the prompt is empty")


def test_missing_prompt_file(
    models: tuple[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(generate_args(models, "--prompt-file", str(tmp_path / "nope.txt"))) == EXIT_USAGE
    assert_one_line_error(capsys.readouterr().err, "cannot read --prompt-file")


def test_prompt_twice(models: tuple[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prompt_file = tmp_path / "prompt.txt"
    prompt_file.write_text(PROMPT)
    assert run([*generate_args(models, "--prompt-file", str(prompt_file)), PROMPT]) == EXIT_USAGE
    assert_one_line_error(capsys.readouterr().err, "either as an argument or with --prompt-file")


@pytest.mark.parametrize("gamma", ["0", "-1", "1000", "two"])
def test_bad_gamma(models: tuple[str, str], capsys: pytest.CaptureFixture[str], gamma: str) -> None:
    assert run([*generate_args(models, "--gamma", gamma), PROMPT]) == EXIT_USAGE
    expected = "must be an integer" if gamma == "two" else "must be in 1..64"
    assert_one_line_error(capsys.readouterr().err, "--gamma", expected)


@pytest.mark.parametrize("seed", ["1.5", "abc"])
def test_non_integer_seed(models: tuple[str, str], capsys: pytest.CaptureFixture[str], seed: str) -> None:
    assert run([*generate_args(models, "--seed", seed), PROMPT]) == EXIT_USAGE
    assert_one_line_error(capsys.readouterr().err, "--seed", "invalid int value")


def test_bad_sampling_setting(models: tuple[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    assert run([*generate_args(models, "--top-p", "0"), PROMPT]) == EXIT_USAGE
    assert_one_line_error(capsys.readouterr().err, "top_p must be in (0, 1]")


def test_bad_logit_bias(models: tuple[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    assert run([*generate_args(models, "--logit-bias", "7"), PROMPT]) == EXIT_USAGE
    assert_one_line_error(capsys.readouterr().err, "--logit-bias takes ID=BIAS")


def test_no_prompt(
    models: tuple[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stdin", Terminal())
    assert run(generate_args(models)) == EXIT_USAGE
    assert_one_line_error(capsys.readouterr().err, "no prompt")


def test_prompt_too_long_for_the_context(models: tuple[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    assert run([*generate_args(models), "--max-new-tokens", "300", PROMPT]) == EXIT_USAGE
    assert_one_line_error(capsys.readouterr().err, "maximum context length is 256")


# --- generate: drafter, verifier, adaptive gamma --------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "drafter", "verifier"),
    [
        (["--drafter", "ngram", "--draft", "none", "--fixed-gamma"], "ngram", "token"),
        (["--draft", "none"], "suffix", "token"),
        (["--drafter", "ngram", "--draft", "none"], "ngram", "token"),
        (["--drafter", "hybrid", "--verifier", "block", "--fixed-gamma"], "hybrid", "block"),
        (["--adaptive-gamma", "--gamma", "3"], "hybrid", "token"),  # a draft model named: the hybrid
        (["--gamma", "3"], "hybrid", "token"),
        (["--drafter", "model", "--gamma", "3"], "model", "token"),
    ],
    ids=lambda value: " ".join(value) if isinstance(value, list) else value,
)
def test_generate_strategies_equal_plain_greedy(
    models: tuple[str, str], capsys: pytest.CaptureFixture[str], flags: list[str], drafter: str, verifier: str
) -> None:
    assert run([*generate_args(models, "--json", "--plain"), PROMPT]) == EXIT_OK
    plain = json_output(capsys)
    assert run([*generate_args(models, "--json", *flags), PROMPT]) == EXIT_OK
    result = json_output(capsys)
    assert result["token_ids"] == plain["token_ids"]
    assert result["gamma"] > 0
    assert (result["drafter"], result["verifier"]) == (drafter, verifier)
    assert result["adaptive_gamma"] == ("--fixed-gamma" not in flags)  # adaptive unless asked


def test_generate_summary_names_the_strategy(
    models: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    code = run(
        [*generate_args(models, "--drafter", "ngram", "--draft", "none", "--verifier", "block"), PROMPT]
    )
    assert code == EXIT_OK
    assert "ngram drafter, block verification" in capsys.readouterr().err


def test_a_summary_without_any_draft_states_no_acceptance(
    models: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """One new token leaves no room for a draft: the summary says so instead of "acceptance nan"."""
    fixed = ("--gamma", "2", "--fixed-gamma")
    assert run([*generate_args(models, *fixed, "--max-new-tokens", "1"), PROMPT]) == EXIT_OK
    err = capsys.readouterr().err
    assert "gamma 2, no draft proposed, 1.00 tokens/round" in err and "nan" not in err
    assert run([*generate_args(models, *fixed), PROMPT]) == EXIT_OK
    assert re.search(r"gamma 2, acceptance [01]\.\d\d, ", capsys.readouterr().err)


def test_a_named_draft_with_a_drafter_that_runs_no_model_is_a_usage_error(
    models: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert run([*generate_args(models, "--drafter", "suffix"), PROMPT]) == EXIT_USAGE
    assert_one_line_error(capsys.readouterr().err, "would not be used", "--drafter model")


def test_generate_hybrid_without_a_draft_is_a_usage_error(
    models: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert run([*generate_args(models, "--drafter", "hybrid", "--draft", "none"), PROMPT]) == EXIT_USAGE
    assert_one_line_error(capsys.readouterr().err, "--drafter hybrid needs a draft model")


def test_generate_rejects_an_unknown_drafter(
    models: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert run([*generate_args(models, "--drafter", "tree"), PROMPT]) == EXIT_USAGE
