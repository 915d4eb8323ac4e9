"""A sweep of bad inputs through the real command line: right exit code, one line naming the problem,
no traceback.

Flag checks run in-process (`main(argv)`, the code `python -m exactspec` runs) with model loading
forbidden, which also proves every flag is checked before any model loads. Real subprocesses are used
only where the process itself matters: signals, a closed stdout, non-UTF-8 argv and stdin.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from exactspec.cli import EXIT_BROKEN_PIPE, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE
from exactspec.cli.main import main

transformers = pytest.importorskip("transformers")

from test_cli import save_tiny  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
PROMPT = "def f(x):"


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("bad-inputs")
    (root / "a-file").write_text("not a folder\n")
    (root / "not-gguf.gguf").write_bytes(b"this is not a GGUF file\n" * 4)
    (root / "no-config").mkdir()
    (root / "latin1.txt").write_bytes("caf\xe9 = 1\n".encode("latin-1"))
    (root / "empty.txt").write_text("\n")
    (root / "prompt.txt").write_text(PROMPT)
    return {
        "file": str(root / "a-file"),
        "below_file": str(root / "a-file" / "out"),
        "not_gguf": str(root / "not-gguf.gguf"),
        "no_config": str(root / "no-config"),
        "latin1": str(root / "latin1.txt"),
        "empty": str(root / "empty.txt"),
        "prompt": str(root / "prompt.txt"),
        "missing": str(root / "missing.txt"),
    }


# The tiny models load with named weights: under `--backend auto` (the default) every load would first
# time "hf int4" and "hf bf16" on them and cache the timings, which is not what these tests are about.
DENSE = ("--weights", "bf16")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    root = tmp_path_factory.mktemp("bad-inputs-models")
    return str(save_tiny(root / "target", 0)), str(save_tiny(root / "draft", 1))


def one_error_line(err: str) -> str:
    assert "Traceback" not in err, err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1, err
    return errors[0]


# (argv, with {file}-style placeholders from `files`; the exit code; a fragment of the error line)
G = ["generate", "--no-progress"]
FLAG_CASES: list[tuple[list[str], int, str]] = [
    # sampling flags
    ([*G, "--temperature", "nan", PROMPT], EXIT_USAGE, "--temperature: must be a finite number"),
    ([*G, "--temperature", "inf", PROMPT], EXIT_USAGE, "--temperature: must be a finite number"),
    ([*G, "--temperature", "-1", PROMPT], EXIT_USAGE, "--temperature: temperature must be in [0, 100]"),
    ([*G, "--temperature", "100.5", PROMPT], EXIT_USAGE, "--temperature: temperature must be in [0, 100]"),
    ([*G, "--temperature", "1e300", PROMPT], EXIT_USAGE, "--temperature: temperature must be in [0, 100]"),
    ([*G, "--temperature", "hot", PROMPT], EXIT_USAGE, "--temperature: must be a number"),
    ([*G, "--top-p", "0", PROMPT], EXIT_USAGE, "--top-p: top_p must be in (0, 1]"),
    ([*G, "--top-p", "1.5", PROMPT], EXIT_USAGE, "--top-p: top_p must be in (0, 1]"),
    ([*G, "--top-p", "nan", PROMPT], EXIT_USAGE, "--top-p: must be a finite number"),
    ([*G, "--min-p", "2", PROMPT], EXIT_USAGE, "--min-p: min_p must be in [0, 1]"),
    ([*G, "--min-p=-inf", PROMPT], EXIT_USAGE, "--min-p: must be a finite number"),
    ([*G, "--top-k", "-1", PROMPT], EXIT_USAGE, "--top-k: must be >= 0"),
    ([*G, "--top-k", "1.5", PROMPT], EXIT_USAGE, "--top-k: must be an integer"),
    ([*G, "--repetition-penalty", "0", PROMPT], EXIT_USAGE, "--repetition-penalty: repetition_penalty"),
    (
        [*G, "--repetition-penalty", "1e-40", PROMPT],
        EXIT_USAGE,
        "--repetition-penalty: repetition_penalty must be in [0.01, 100]",
    ),
    (
        [*G, "--repetition-penalty", "5e-324", PROMPT],
        EXIT_USAGE,
        "--repetition-penalty: repetition_penalty must be in [0.01, 100]",
    ),
    ([*G, "--repetition-penalty", "1e300", PROMPT], EXIT_USAGE, "--repetition-penalty: repetition_penalty"),
    ([*G, "--repetition-penalty", "nan", PROMPT], EXIT_USAGE, "--repetition-penalty: must be a finite"),
    ([*G, "--logit-bias", "7", PROMPT], EXIT_USAGE, "--logit-bias takes ID=BIAS"),
    ([*G, "--logit-bias", "a=1", PROMPT], EXIT_USAGE, "--logit-bias takes ID=BIAS"),
    ([*G, "--logit-bias", "3=nan", PROMPT], EXIT_USAGE, "BIAS must be a number in [-100, 100]"),
    ([*G, "--logit-bias", "3=inf", PROMPT], EXIT_USAGE, "BIAS must be a number in [-100, 100]"),
    ([*G, "--logit-bias", "3=1e39", PROMPT], EXIT_USAGE, "BIAS must be a number in [-100, 100]"),
    ([*G, "--logit-bias", "3=-1e39", PROMPT], EXIT_USAGE, "BIAS must be a number in [-100, 100]"),
    ([*G, "--logit-bias", "7=1e300", PROMPT], EXIT_USAGE, "BIAS must be a number in [-100, 100]"),
    ([*G, "--logit-bias", "7=100.5", PROMPT], EXIT_USAGE, "BIAS must be a number in [-100, 100]"),
    ([*G, "--logit-bias=-3=1", PROMPT], EXIT_USAGE, "the token ID must be >= 0"),
    ([*G, "--logit-bias", "3=1", "--logit-bias", "3=2", PROMPT], EXIT_USAGE, "gives token 3 twice"),
    # decoding flags
    ([*G, "--gamma", "0", PROMPT], EXIT_USAGE, "--gamma: must be in 1..64"),
    ([*G, "--gamma", "65", PROMPT], EXIT_USAGE, "--gamma: must be in 1..64"),
    ([*G, "--gamma", "two", PROMPT], EXIT_USAGE, "--gamma: must be an integer"),
    ([*G, "--max-new-tokens", "0", PROMPT], EXIT_USAGE, "--max-new-tokens: must be >= 1"),
    ([*G, "--max-new-tokens", "-5", PROMPT], EXIT_USAGE, "--max-new-tokens: must be >= 1"),
    ([*G, "--seed", "1.5", PROMPT], EXIT_USAGE, "--seed: invalid int value"),
    ([*G, "--stop", "", PROMPT], EXIT_USAGE, "--stop: must not be empty"),
    ([*G, "--frobnicate", PROMPT], EXIT_USAGE, "unrecognized arguments: --frobnicate"),
    # models and caches
    ([*G, "--target", "", PROMPT], EXIT_USAGE, "--target: must not be empty"),
    ([*G, "--draft", " ", PROMPT], EXIT_USAGE, "--draft: must not be empty"),
    ([*G, "--cache-dir", "", PROMPT], EXIT_USAGE, "--cache-dir: must not be empty"),
    ([*G, "--cache-dir", "{file}", PROMPT], EXIT_USAGE, "--cache-dir {file} is a file"),
    (
        [*G, "--target", "/nonexistent/x.gguf", PROMPT],
        EXIT_USAGE,
        "--target: /nonexistent/x.gguf does not exist",
    ),
    ([*G, "--target", "{not_gguf}", PROMPT], EXIT_USAGE, "is not a GGUF file"),
    ([*G, "--target", "{no_config}", PROMPT], EXIT_USAGE, "has no config.json"),
    ([*G, "--draft", "/nonexistent/draft", PROMPT], EXIT_USAGE, "--draft: /nonexistent/draft does not exist"),
    ([*G, "--dtype", "float8", PROMPT], EXIT_USAGE, "--dtype: Unknown dtype 'float8'"),
    # prompts
    ([*G, ""], EXIT_USAGE, "the prompt is empty"),
    ([*G, "caf\udce9"], EXIT_USAGE, "the prompt argument is not valid UTF-8"),
    ([*G, "--prompt-file", ""], EXIT_USAGE, "--prompt-file: must not be empty"),
    ([*G, "--prompt-file", "{missing}"], EXIT_USAGE, "cannot read --prompt-file"),
    ([*G, "--prompt-file", "{latin1}"], EXIT_USAGE, "is not valid UTF-8 text (byte 0xe9 at offset 3)"),
    ([*G, "--prompt-file", "{empty}"], EXIT_USAGE, "the prompt is empty"),
    ([*G, "--prompt-file", "{prompt}", PROMPT], EXIT_USAGE, "either as an argument or with --prompt-file"),
    # verify
    (["verify", "--statistical", "--significance", "nan"], EXIT_USAGE, "--significance: must be a finite"),
    (["verify", "--statistical", "--significance", "-1"], EXIT_USAGE, "--significance must be in (0, 1)"),
    (["verify", "--statistical", "--significance", "1"], EXIT_USAGE, "--significance must be in (0, 1)"),
    (["verify", "--statistical", "--significance", "0"], EXIT_USAGE, "--significance must be in (0, 1)"),
    (["verify", "--statistical", "--vocab", "1"], EXIT_USAGE, "--vocab must be >= 2"),
    (["verify", "--statistical", "--vocab", "1000000000"], EXIT_USAGE, "--vocab must be <= 20000"),
    (
        ["verify", "--statistical", "--vocab", "20000", "--gamma", "64"],
        EXIT_USAGE,
        "lower --vocab or --gamma",
    ),
    (["verify", "--statistical", "--length", "0"], EXIT_USAGE, "--length must be >= 1"),
    (["verify", "--statistical", "--length", "100"], EXIT_USAGE, "--length must be <= 16"),
    (["verify", "--statistical", "--samples", "0"], EXIT_USAGE, "--samples: must be >= 1"),
    (["verify", "--statistical", "--gamma", "0"], EXIT_USAGE, "--gamma: must be in 1..64"),
    (["verify", "--statistical", "--logit-bias", "5000=1"], EXIT_USAGE, "outside the vocabulary"),
    (["verify", "--temperature", "nan"], EXIT_USAGE, "--temperature: must be a finite number"),
    # bench: every flag, the output folder included, before the models load
    (["bench", "--out", "{file}"], EXIT_USAGE, "--out {file} is a file, not a folder"),
    (["bench", "--out", "{below_file}"], EXIT_USAGE, "cannot be used as the report folder"),
    (["bench", "--out", ""], EXIT_USAGE, "--out must not be empty"),
    (["bench", "--gammas", "0"], EXIT_USAGE, "--gammas must lie in 1..64"),
    (["bench", "--gammas", "a,b"], EXIT_USAGE, "expected comma-separated integers"),
    (["bench", "--temperatures", "nan"], EXIT_USAGE, "expected finite numbers in [0, 100]"),
    (["bench", "--temperatures", "inf"], EXIT_USAGE, "expected finite numbers in [0, 100]"),
    (["bench", "--temperatures", "-1"], EXIT_USAGE, "expected finite numbers in [0, 100]"),
    (["bench", "--temperatures", "0.7,101"], EXIT_USAGE, "expected finite numbers in [0, 100]"),
    (["bench", "--max-new-tokens", "1"], EXIT_USAGE, "--max-new-tokens must be >= 2"),
    (["bench", "--draft", "none"], EXIT_USAGE, "needs a draft model"),
    (["bench", "--threads", "0"], EXIT_USAGE, "--threads: must be >= 1"),
    (["bench", "--target", "/nonexistent"], EXIT_USAGE, "--target: /nonexistent does not exist"),
    # audit
    (["audit", "--tiny", "--significance", "2"], EXIT_USAGE, "--significance must be in (0, 1)"),
    (["audit", "--tiny", "--significance", "nan"], EXIT_USAGE, "--significance: must be a finite"),
    (["audit", "--out", "{file}"], EXIT_USAGE, "--out {file} is a file, not a folder"),
    (["audit", "--tiny", "--out", "{below_file}"], EXIT_USAGE, "cannot be used as the report folder"),
    (["audit", "--prompt", "  "], EXIT_USAGE, "--prompt is empty"),
    (["audit", "--prompt", "\udcff"], EXIT_USAGE, "--prompt is not valid UTF-8"),
    (["audit", "--draft", "none"], EXIT_USAGE, "the audit needs a draft model"),
    (["audit", "--tiny", "--gamma", "0"], EXIT_USAGE, "--gamma: must be in 1..64"),
    (["audit", "--tiny", "--samples", "0"], EXIT_USAGE, "--samples: must be >= 1"),
    (["audit", "--generator", "nope"], EXIT_USAGE, "--generator: invalid choice"),
    (["audit", "--target", "{not_gguf}"], EXIT_USAGE, "is not a GGUF file"),
    (["audit", "--temperature", "-0.5"], EXIT_USAGE, "--temperature: temperature must be in [0, 100]"),
]


@pytest.fixture
def no_loading(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any model load or default-pair fetch fails the test: flag errors must come before them."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a model was loaded before the flags were checked")

    monkeypatch.setattr("exactspec.models.loading.load_hf_model", refuse)
    monkeypatch.setattr("exactspec.models.loading.ensure_parted_model", refuse)
    monkeypatch.setattr("exactspec.audit.tiny.tiny_pair", refuse)


@pytest.mark.parametrize(
    ("argv", "code", "fragment"), FLAG_CASES, ids=[" ".join(c[0])[:60] for c in FLAG_CASES]
)
def test_bad_flag(
    argv: list[str],
    code: int,
    fragment: str,
    files: dict[str, str],
    no_loading: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = [arg.format(**files) if "{" in arg else arg for arg in argv]
    assert main(argv) == code
    line = one_error_line(capsys.readouterr().err)
    assert fragment.format(**files) in line, line
    assert line.startswith(("exactspec: error:", f"exactspec {argv[0]}: error:")), line


def test_enough_bad_inputs_are_swept() -> None:
    assert len(FLAG_CASES) >= 60


def test_no_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == EXIT_USAGE
    assert "verify" in capsys.readouterr().out


def test_help_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "--help"]) == EXIT_OK
    assert "--logit-bias" in capsys.readouterr().out


# --- runtime failures are exit 1, internal errors are reported as bugs ---------------------------


def test_fetch_failure_is_a_runtime_failure(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """Before: a failed fetch of the default pair exited 2, like a usage error."""
    from exactspec.artefacts.default_pair import DefaultPairError

    def failing(*args: object, **kwargs: object) -> None:
        raise DefaultPairError("pip could not download the parts of the default pair")

    monkeypatch.setattr("exactspec.models.loading.ensure_parted_model", failing)
    assert main([*G, PROMPT]) == EXIT_FAILED
    assert "pip could not download" in one_error_line(capsys.readouterr().err)


def test_unwritable_cache_is_a_runtime_failure(files: dict[str, str], capsys) -> None:
    assert main([*G, "--cache-dir", files["below_file"], PROMPT]) == EXIT_FAILED
    assert "Cannot create the cache folder" in one_error_line(capsys.readouterr().err)


def test_unloadable_model_folder_is_a_runtime_failure(tmp_path: Path, capsys) -> None:
    (tmp_path / "config.json").write_text("{ this is not json")
    assert main([*G, "--target", str(tmp_path), "--plain", PROMPT]) == EXIT_FAILED
    assert "Could not load the model folder" in one_error_line(capsys.readouterr().err)


def test_internal_value_error_is_reported_as_a_bug(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """Before: every ValueError, internal ones included, became exit 2 with no traceback anywhere."""

    def broken(*args: object, **kwargs: object) -> None:
        raise ValueError("an internal invariant failed")

    monkeypatch.setattr("exactspec.checking.grid.exact_grid", broken)
    assert main(["verify", "--quick", "--no-progress"]) == EXIT_FAILED
    err = capsys.readouterr().err
    assert "Traceback" not in err
    (line,) = err.strip().splitlines()
    assert "internal error" in line and "ValueError: an internal invariant failed" in line
    where = Path(line.rsplit("full traceback in ", 1)[1])
    try:
        assert "Traceback" in where.read_text() and "an internal invariant failed" in where.read_text()
    finally:
        where.unlink()
    assert main(["--debug", "verify", "--quick", "--no-progress"]) == EXIT_FAILED
    assert "Traceback" in capsys.readouterr().err
    assert main(["verify", "--quick", "--no-progress", "--debug"]) == EXIT_FAILED
    assert "Traceback" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("error", "code"),
    [(KeyboardInterrupt(), EXIT_INTERRUPTED), (BrokenPipeError(32, "Broken pipe"), EXIT_BROKEN_PIPE)],
)
def test_interruptions_in_process(
    monkeypatch: pytest.MonkeyPatch, capsys, error: BaseException, code: int
) -> None:
    def raising(*args: object, **kwargs: object) -> None:
        raise error

    monkeypatch.setattr("exactspec.checking.grid.exact_grid", raising)
    assert main(["verify", "--quick", "--no-progress"]) == code
    assert "Traceback" not in capsys.readouterr().err


def test_json_never_prints_nan(models: tuple[str, str], capsys) -> None:
    """Before: --plain --json printed "acceptance_rate": NaN, which is not JSON."""
    argv = [*G, "--target", models[0], *DENSE, "--plain", "--json", "--max-new-tokens", "4", PROMPT]
    assert main(argv) == EXIT_OK
    out = capsys.readouterr().out

    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} in --json output")

    result = json.loads(out, parse_constant=refuse)
    assert result["statistics"]["acceptance_rate"] is None


def test_logit_bias_outside_the_vocabulary_is_a_usage_error(models: tuple[str, str], capsys) -> None:
    argv = [*G, "--target", models[0], "--draft", models[1], *DENSE, "--logit-bias", "100000=1", PROMPT]
    assert main(argv) == EXIT_USAGE
    assert "--logit-bias: logit_bias names token id(s) [100000] outside the vocabulary" in one_error_line(
        capsys.readouterr().err
    )


# --- real processes ------------------------------------------------------------------------------


# The prompt is checked first; should that ever change, this fails fast instead of loading the default pair.
NEVER_LOADED = ("--no-progress", "--target", "/nonexistent/never-loaded.gguf")


def _command(*args: str) -> list[str]:
    return [sys.executable, "-m", "exactspec", *args]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}


def test_non_utf8_argv_and_stdin(files: dict[str, str]) -> None:
    """Before: a traceback (UnicodeEncodeError in the tokenizer, UnicodeDecodeError reading stdin)."""
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    # Both at once: each spends its time importing, on a core of its own where there are two.
    argv = subprocess.Popen(
        [os.fsencode(a) for a in _command("generate", *NEVER_LOADED)] + [b"caf\xe9"], env=_env(), **pipes
    )
    stdin = subprocess.Popen(
        _command("generate", *NEVER_LOADED, "-"), env=_env(), stdin=subprocess.PIPE, **pipes
    )
    _, stdin_err = stdin.communicate("caf\xe9\n".encode("latin-1"), timeout=120)
    _, argv_err = argv.communicate(timeout=120)
    assert argv.returncode == stdin.returncode == EXIT_USAGE
    assert "the prompt argument is not valid UTF-8" in one_error_line(argv_err.decode())
    assert "standard input is not valid UTF-8" in one_error_line(stdin_err.decode())


def _wait_until_torch_is_loading(pid: int, timeout: float = 60.0) -> None:
    """Block until process `pid` has mapped libtorch: it is then past interpreter start-up and inside
    exactspec's own imports. A fixed sleep raced with start-up on a loaded machine (the signal then hit
    `site` before exactspec's handler existed)."""
    maps = Path(f"/proc/{pid}/maps")
    if not maps.exists():
        pytest.skip("needs /proc to see when the child is importing torch")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if "libtorch" in maps.read_text():
                return
        except OSError:  # the process ended
            return
        time.sleep(0.005)


def test_ctrl_c_during_start_up_and_during_a_run(sigint_not_ignored: None) -> None:
    """Before: Ctrl-C while the imports ran printed a KeyboardInterrupt traceback."""
    starting = subprocess.Popen(
        _command("verify", "--quick", "--no-progress"),
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    running = subprocess.Popen(
        _command("verify", "--quick", "--no-progress"),
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _wait_until_torch_is_loading(starting.pid)  # inside the imports (torch alone takes seconds)
    starting.send_signal(signal.SIGINT)
    assert running.stdout is not None
    running.stdout.readline()  # the table header: the grid is running
    running.send_signal(signal.SIGINT)
    for process in (starting, running):
        _, err = process.communicate(timeout=120)
        err = err if isinstance(err, str) else err.decode()
        assert process.returncode == EXIT_INTERRUPTED, err
        assert "Traceback" not in err and "interrupted" in err, err


def test_stdout_closed_early_exits_quietly(models: tuple[str, str]) -> None:
    """`exactspec generate ... | head -c 10`: before, a BrokenPipeError traceback."""
    process = subprocess.Popen(
        _command(
            "generate",
            "--no-progress",
            "--target",
            models[0],
            "--draft",
            models[1],
            *DENSE,
            "--max-new-tokens",
            "40",
            PROMPT,
        ),
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None
    process.stdout.close()  # the reader is gone before the first token is written
    _, err = process.communicate(timeout=120)
    assert process.returncode == EXIT_BROKEN_PIPE, err
    assert b"Traceback" not in err and b"Exception ignored" not in err, err
