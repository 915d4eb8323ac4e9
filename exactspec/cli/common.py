"""What every `exactspec` command shares: exit codes, the usage error, and the model and sampling flags.

Every flag is checked here or in its command's module before any model is
loaded, so a bad flag costs nothing and a long run cannot fail at its end on
something that was known at its start (an output folder that is a file).
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from exactspec.cli import EXIT_BROKEN_PIPE, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE
from exactspec.decoding.engine import MAX_GAMMA
from exactspec.decoding.strategy import VERIFIERS, Strategy
from exactspec.drafters.registry import drafter_kinds
from exactspec.foundations.defaults import DEFAULTS
from exactspec.foundations.errors import InvalidArgument
from exactspec.foundations.grammar import Structure
from exactspec.foundations.provenance import Provenance
from exactspec.foundations.settings import (
    LOGIT_BIAS_MAX,
    OUTPUT_PENALTY_MAX,
    REPETITION_PENALTY_MAX,
    REPETITION_PENALTY_MIN,
    TEMPERATURE_MAX,
    SamplingSettings,
)
from exactspec.models.backends.registry import Workload, backends

__all__ = [
    "EXIT_BROKEN_PIPE",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_USAGE",
    "UsageError",
]

DEFAULT_DRAFT_SPEC = DEFAULTS.draft
"""--draft's default: the built-in draft model (`exactspec.models.loading.DEFAULT_SPECS`)."""


class UsageError(InvalidArgument):
    """Bad input from the user: reported as one line, exit code 2, no traceback."""


def finite_float(text: str) -> float:
    """argparse type: a finite number (no nan, no inf)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def _int_at_least(text: str, low: int) -> int:
    """An integer >= low from a flag's text, or the argparse error that says which rule it broke."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
    return value


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    return _int_at_least(text, 0)


def check_significance(value: float) -> None:
    """--significance: a finite number strictly between 0 and 1 (the flag's type already refused nan, inf)."""
    if not 0.0 < value < 1.0:
        raise UsageError(f"--significance must be in (0, 1), e.g. 1e-3; got {value:g}")


def non_empty(text: str) -> str:
    """argparse type: a string with something in it (an empty path would mean the current folder)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def utf8_text(name: str, text: str) -> str:
    """`text` unchanged if it is valid Unicode; argv bytes that are not UTF-8 arrive as lone surrogates."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise UsageError(
            f"{name} is not valid UTF-8 text (byte 0x{ord(text[error.start]) & 0xFF:02x} at character "
            f"{error.start}); give UTF-8 text (convert with iconv -t UTF-8)"
        ) from None
    return text


def decode_utf8(name: str, data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise UsageError(
            f"{name} is not valid UTF-8 text (byte 0x{data[error.start]:02x} at offset {error.start}); "
            f"give UTF-8 text (convert with iconv -t UTF-8)"
        ) from None


def output_folder(flag: str, folder: str) -> Path:
    """Create `folder` (or check it) and check that a file can be written in it, before any work starts."""
    if not folder.strip():
        raise UsageError(f"{flag} must not be empty; give a folder for the reports")
    path = Path(folder).expanduser()
    if path.exists() and not path.is_dir():
        raise UsageError(f"{flag} {folder} is a file, not a folder; give a folder (it is created if needed)")
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".exactspec-write-test-"):
            pass
    except OSError as error:
        reason = error.strerror or str(error)
        if isinstance(error, FileExistsError | NotADirectoryError):
            reason = "a file stands where a folder of its path should be"
        raise UsageError(
            f"{flag} {folder} cannot be used as the report folder ({reason}); give a writable folder"
        ) from None
    return path


def report_lines(progress: bool) -> Callable[[str], None] | None:
    """Where the library's lines for the user go on the command line (`ModelPair.from_pretrained`'s
    `report`): stderr, "[exactspec] " first, unless --no-progress."""
    if not progress:
        return None
    return lambda line: print(f"[exactspec] {line}", file=sys.stderr, flush=True)


def backend_name(args: argparse.Namespace) -> str:
    """The registered backend `--backend` names: the one place a command reads the flag before loading a
    pair. "auto" stays "auto": `ModelPair.from_pretrained` resolves it (measured, cached) and the pair
    says what ran (`pair.backend`), which is what a command's backend-dependent parts then read."""
    name = getattr(args, "backend", DEFAULTS.backend)
    known = backends()
    if name not in known:
        raise UsageError(f"--backend must be one of {', '.join(known)}; got {name!r}")
    return name


def lacks_transformers_modules(pair: Any, part: str, say: Callable[[str], None]) -> bool:
    """True, after one line through `say`, when `pair`'s backend loaded no transformers modules, so that
    `part` of a command (the transformers peers, forward-pass hooks) is skipped; False when it can run."""
    if pair.target_model is not None:
        return False
    say(
        f"{part} skipped: the {pair.backend} backend loads no transformers modules "
        "(the rest of the command runs on it)"
    )
    return True


def add_sampling_arguments(
    parser: argparse.ArgumentParser, temperature: float = DEFAULTS.temperature
) -> None:
    """The sampling flags shared by every command that samples; `temperature` is the command's default.

    Each flag's range (`exactspec.foundations.settings`) is in its help; a value outside it is exit 2
    naming the flag, before any model loads (`sampling_settings`)."""
    group = parser.add_argument_group("sampling (define p and q; Hugging Face semantics)")
    group.add_argument(
        "--temperature",
        type=finite_float,
        default=temperature,
        help=f"in [0, {TEMPERATURE_MAX:g}]; 0 = greedy, as is a positive T too small to divide by "
        f"(default {temperature:g})",
    )
    group.add_argument(
        "--top-k", type=non_negative_int, default=0, help="keep the k most likely tokens (0 = off)"
    )
    group.add_argument("--top-p", type=finite_float, default=1.0, help="nucleus mass in (0, 1] (1 = off)")
    group.add_argument(
        "--min-p",
        type=finite_float,
        default=0.0,
        help="drop tokens below min_p * max prob, in [0, 1] (0 = off)",
    )
    group.add_argument(
        "--repetition-penalty",
        type=finite_float,
        default=1.0,
        help=f"HF repetition penalty, in [{REPETITION_PENALTY_MIN:g}, {REPETITION_PENALTY_MAX:g}] (1 = off)",
    )
    group.add_argument(
        "--presence-penalty",
        type=finite_float,
        default=0.0,
        help=f"OpenAI's presence penalty, in [-{OUTPUT_PENALTY_MAX:g}, {OUTPUT_PENALTY_MAX:g}]: subtracted "
        "from the logit of every token already generated (the prompt does not count; 0 = off)",
    )
    group.add_argument(
        "--frequency-penalty",
        type=finite_float,
        default=0.0,
        help=f"OpenAI's frequency penalty, in [-{OUTPUT_PENALTY_MAX:g}, {OUTPUT_PENALTY_MAX:g}]: times the "
        "number of times a token was generated, subtracted from its logit (0 = off)",
    )
    group.add_argument(
        "--logit-bias",
        action="append",
        default=[],
        metavar="ID=BIAS",
        help=f"add BIAS, in [-{LOGIT_BIAS_MAX:g}, {LOGIT_BIAS_MAX:g}], to token ID's logit (repeatable; "
        "-inf bans the token)",
    )


def sampling_settings(args: argparse.Namespace) -> SamplingSettings:
    """The `SamplingSettings` the sampling flags describe."""
    bias: dict[int, float] = {}
    for item in args.logit_bias:
        token, sep, value = item.partition("=")
        try:
            token_id, number = int(token), float(value)
        except ValueError:
            raise UsageError(f"--logit-bias takes ID=BIAS, e.g. 42=-1.5; got {item!r}") from None
        if not sep:
            raise UsageError(f"--logit-bias takes ID=BIAS, e.g. 42=-1.5; got {item!r}")
        if token_id < 0:
            raise UsageError(f"--logit-bias {item!r}: the token ID must be >= 0")
        if math.isnan(number) or (number != -math.inf and abs(number) > LOGIT_BIAS_MAX):
            raise UsageError(
                f"--logit-bias {item!r}: BIAS must be a number in [-{LOGIT_BIAS_MAX:g}, {LOGIT_BIAS_MAX:g}], "
                "or -inf to ban the token"
            )
        if token_id in bias:
            raise UsageError(f"--logit-bias gives token {token_id} twice; give each ID once")
        bias[token_id] = number
    try:
        return SamplingSettings(
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            min_p=args.min_p,
            repetition_penalty=args.repetition_penalty,
            logit_bias=bias,
            presence_penalty=args.presence_penalty,
            frequency_penalty=args.frequency_penalty,
        )
    except ValueError as error:
        raise UsageError(_flag_message(str(error))) from None


def add_structure_arguments(parser: argparse.ArgumentParser) -> None:
    """--json-schema FILE and --grammar FILE: structured output (`exactspec.foundations.grammar`)."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--json-schema",
        metavar="FILE",
        type=non_empty,
        help="constrain the output to JSON valid against the JSON schema in FILE (written on one line, "
        "as json.dumps writes it), exactly: the constraint is a transform of p and q",
    )
    group.add_argument(
        "--grammar", metavar="FILE", type=non_empty, help="constrain the output to the GBNF grammar in FILE"
    )


def structure(args: argparse.Namespace) -> Structure | None:
    """The `Structure` that --json-schema or --grammar names (their files read and parsed), or None."""
    flag, path = ("--json-schema", args.json_schema) if args.json_schema else ("--grammar", args.grammar)
    if path is None:
        return None
    try:
        text = Path(path).expanduser().read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise UsageError(
            f"cannot read {flag} {path!r}: {getattr(error, 'strerror', None) or error}"
        ) from None
    try:
        return Structure.json_schema(text) if flag == "--json-schema" else Structure.gbnf(text)
    except InvalidArgument as error:
        raise UsageError(f"{flag} {path}: {error}") from None


def _flag_message(message: str) -> str:
    """A `SamplingSettings` message that names its flag: "top_p must ..." -> "--top-p: top_p must ..."."""
    names = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "logit_bias")
    for name in (*names, "presence_penalty", "frequency_penalty"):
        if message.startswith(name):
            return f"--{name.replace('_', '-')}: {message}"
    return message


def add_strategy_arguments(parser: argparse.ArgumentParser, adaptive: bool = DEFAULTS.adaptive_gamma) -> None:
    """--drafter (the registry's names), --drafter-option, --verifier, --adaptive-gamma / --fixed-gamma
    (`Strategy`); `adaptive`: the command's default (batch jobs draft a fixed gamma)."""
    kinds = drafter_kinds()
    group = parser.add_argument_group("speculation (every choice is exact; they differ in speed)")
    group.add_argument(
        "--drafter",
        choices=list(kinds),
        default=None,
        help="; ".join(
            f"{kind.name}: {kind.summary}" + (" (default)" if kind.name == DEFAULTS.drafter else "")
            for kind in kinds.values()
        )
        + f"; when --drafter is not given and no draft model is loaded (--draft none, or --target without "
        f"--draft), {DEFAULTS.free_drafter}",
    )
    options = [
        f"{kind.name}: {', '.join(option.name for option in kind.options)}"
        for kind in kinds.values()
        if kind.options
    ]
    group.add_argument(
        "--drafter-option",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an option of the chosen drafter (repeatable; " + "; ".join(options) + ")",
    )
    group.add_argument(
        "--verifier",
        choices=list(VERIFIERS),
        default=DEFAULTS.verifier,
        help="token: token-by-token verification (default); block: block verification (Sun et al. 2025), "
        "never fewer tokens per round",
    )
    group.add_argument(
        "--adaptive-gamma",
        action="store_true",
        default=adaptive,
        help="plan each round's draft lengths (0..gamma each, gamma the most) from each row's acceptance "
        "and the measured times of whole rounds, corrected as rounds run: a round no draft is predicted "
        "to speed up is plain; the more rows a round holds, the less they draft"
        + (" (default)" if adaptive else ""),
    )
    group.add_argument(
        "--fixed-gamma",
        dest="adaptive_gamma",
        action="store_false",
        help="every round drafts gamma tokens (fewer only near the length limit)"
        + ("" if adaptive else " (default)"),
    )


def strategy(args: argparse.Namespace) -> Strategy:
    """The `Strategy` the speculation flags describe (UsageError for an unknown or bad drafter option)."""
    given: dict[str, str] = {}
    for item in getattr(args, "drafter_option", []):
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise UsageError(f"--drafter-option takes NAME=VALUE, e.g. max_ngram=3; got {item!r}")
        given[name.strip()] = value.strip()
    try:
        return Strategy(
            drafter=args.drafter or implied_drafter(args),
            verifier=args.verifier,
            adaptive_gamma=args.adaptive_gamma,
            drafter_options=tuple(sorted(given.items())),
        )
    except ValueError as error:
        raise UsageError(f"--drafter-option: {error}") from None


def workload(args: argparse.Namespace, chosen: Strategy, *, plain: bool, rows: int = 1) -> Workload:
    """What the command will decode, for `--backend auto` to choose by (`registry.Workload`): plain, or
    `chosen`'s drafter with --gamma (its default when none; a cap when planned), on `rows` rows together."""
    gamma = getattr(args, "gamma", None)
    if plain or gamma == 0:
        return Workload.plain(rows)
    if gamma is None:
        gamma = chosen.default_gamma(getattr(args, "weights", DEFAULTS.weights))
    return Workload(chosen.drafter, chosen.needs_draft_model, gamma, rows, fixed=not chosen.adaptive_gamma)


def names_a_draft(args: argparse.Namespace) -> bool:
    """Whether --draft names a model of the user's (neither the built-in default nor "none")."""
    draft = getattr(args, "draft", DEFAULT_DRAFT_SPEC)
    return draft != DEFAULT_DRAFT_SPEC and draft.lower() != "none"


def implied_drafter(args: argparse.Namespace) -> str:
    """The drafter when --drafter is not given (`DEFAULTS.drafter_for`): the hybrid where a draft model
    will be loaded (--draft names one, or the built-in target runs with the built-in draft), else the
    suffix drafter (--draft none, or a target of the user's with no --draft: the built-in draft's
    vocabulary is Qwen2.5's, so it is not loaded for another target unless a drafter asks for it)."""
    target, draft = getattr(args, "target", DEFAULTS.target), getattr(args, "draft", DEFAULT_DRAFT_SPEC)
    return DEFAULTS.drafter_for(draft_loaded=DEFAULTS.loads_draft(target, draft))


def draft_to_load(args: argparse.Namespace, chosen: Strategy) -> str | None:
    """The --draft to load for `chosen` (generate, serve, batch), or None: --plain, --draft none, or a
    drafter that runs no model (the suffix drafter, prompt lookup). Raises UsageError for a
    drafter that needs the draft model without one, and for a --draft named with a drafter that would
    not use it (a draft model the user named and that silently does nothing is a wrong answer)."""
    no_draft = args.draft.lower() == "none"
    if args.plain:
        return None
    if not chosen.needs_draft_model:
        if names_a_draft(args):
            raise UsageError(
                f"--draft {args.draft} would not be used: --drafter {chosen.drafter} runs no draft model; "
                "add --drafter model (or hybrid) to draft with it, or drop --draft"
            )
        return None
    if no_draft:
        raise UsageError(
            f"--drafter {chosen.drafter} needs a draft model; drop --draft none or use a drafter that needs "
            f"none (--drafter {DEFAULTS.free_drafter})"
        )
    return args.draft


def gamma_argument(text: str) -> int:
    """argparse type: a draft length in 1..MAX_GAMMA."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
    if not 1 <= value <= MAX_GAMMA:
        raise argparse.ArgumentTypeError(f"must be in 1..{MAX_GAMMA} (use --plain for no draft), got {value}")
    return value


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    return _int_at_least(text, 1)


def command_provenance(args: argparse.Namespace) -> Provenance:
    """The provenance of this command's outputs: code, machine, now, and the command line as given
    (`cli.main` keeps it on `args`; parsed without it, the process's own `sys.argv`)."""
    return Provenance.collect(getattr(args, "argv", None))
