"""The grid of `exactspec verify`: the lists of exact checks over toy model pairs and every backend's cases.

The exact grid covers what docs/algorithm.md says must hold: every gamma, tiny
vocabularies with EOS, length limits below gamma, a draft equal to the target
(beta = 0), supports that miss each other's tokens, a deterministic (one-hot)
draft, every sampling transform, and a batch whose rows have different
histories; then the same for block verification, the prompt-lookup and hybrid
drafters (including rounds where the lookup finds no match) and adaptive
gamma (`round_two_grid`), trees of deterministic candidates verified by tree
verification (`tree_cases`), constrained rounds under a toy grammar (`grammar_cases`), and the shipped
sampler's draws keyed by position (`positioned_cases`: each draw's law, and point-mass drafts giving
plain decoding's tokens whatever gamma). Then every
registered backend's own cases (`backend_cases`: the cells
its registration lists, `Backend.tiny`): the same enumeration through the backend's real adapters over
tiny random transformers models (`tiny_hf`), so KV cache rows, rollback, holes, compaction and
position ids are inside the proof; the target's distribution comes from no-cache full forwards of the
same float64 weights, to the backend's tolerance. A backend that cannot run here is skipped, and
`exactspec verify` says why (`skipped_backends`).
"""

from __future__ import annotations

import torch

from exactspec.checking.cases import (
    BLOCK,
    EXACT_TOLERANCE,
    GRID_BATCH_COSTS,
    GRID_POLICY_OPTIONS,
    MODEL,
    QUICK_MAX_NEW_TOKENS,
    QUICK_MAX_VOCAB,
    BackendCase,
    BackendTreeCase,
    ExactCase,
    ExactResult,
    PointMassCase,
    PositionedLawCase,
    TreeCase,
    grid_round_time,
    run_exact_case,
    run_exact_grid,
)
from exactspec.checking.scheduled import ScheduledRow
from exactspec.checking.statistical import StatisticalSetup, run_statistical
from exactspec.checking.toy_grammar import grammar_cases
from exactspec.decoding.strategy import VERIFIERS, Strategy
from exactspec.drafters.registry import drafter_kinds
from exactspec.foundations.settings import SamplingSettings
from exactspec.models.backends.registry import backends

__all__ = [
    "BLOCK",
    "EXACT_TOLERANCE",
    "GRID_BATCH_COSTS",
    "GRID_POLICY_OPTIONS",
    "MODEL",
    "QUICK_MAX_NEW_TOKENS",
    "QUICK_MAX_VOCAB",
    "BackendCase",
    "BackendTreeCase",
    "ExactCase",
    "ExactResult",
    "StatisticalSetup",
    "TreeCase",
    "backend_cases",
    "exact_grid",
    "grammar_cases",
    "grid_round_time",
    "registered_drafter_cases",
    "round_two_grid",
    "run_exact_case",
    "run_exact_grid",
    "run_statistical",
    "scheduler_cases",
    "skipped_backends",
    "suffix_tree_cases",
    "tree_cases",
]
"""The case types, the runner and the statistical mode live in `checking.cases` and
`checking.statistical`; `exactspec verify` and the tests read them here, beside the lists."""


OUTPUT_PENALTIES = SamplingSettings(presence_penalty=1.5, frequency_penalty=0.8)
"""OpenAI's penalties against repeating what the row generated: the draft block's later positions count
the drafted tokens before them (docs/algorithm.md 4), which a 3-token run over 4 ids repeats often."""
REPEATING_PENALTIES = SamplingSettings(temperature=0.9, presence_penalty=-2.0, frequency_penalty=-1.2)
"""The same at the negative end of their range: repeats favoured, so a prompt-lookup draft often holds."""
GREEDY_REPEATS = SamplingSettings(temperature=0.0, presence_penalty=-2.0, frequency_penalty=-2.0)
"""Greedy rows whose argmax the penalties move towards what they generated."""
ALL_TRANSFORMS = SamplingSettings(
    temperature=0.8,
    top_k=3,
    top_p=0.9,
    min_p=0.05,
    repetition_penalty=1.3,
    logit_bias={1: 0.5},
    presence_penalty=0.6,
    frequency_penalty=0.4,
)
"""Every sampling transform at once."""


def skipped_backends() -> dict[str, str]:
    """The registered backends with exactness cases that cannot run here, and why (`verify` says so)."""
    return {
        name: why
        for name, registered in backends().items()
        if registered.tiny is not None and (why := registered.unavailable()) is not None
    }


def backend_cases(name: str | None = None) -> list[BackendCase]:
    """Every registered backend's exactness cases (or backend `name`'s), by rank; a backend that cannot
    run here has none (`skipped_backends`)."""
    cases: list[BackendCase] = []
    for registered_name, registered in backends().items():
        if name is not None and registered_name != name:
            continue
        if registered.tiny is None or registered.unavailable() is not None:
            continue
        cases += [BackendCase.from_cell(registered_name, cell) for cell in registered.tiny.cells()]
    return cases


def exact_grid() -> list[ExactCase]:
    """The grid of `exactspec verify` (and of the test suite)."""
    cases: list[ExactCase] = []
    for gamma in (1, 2, 3, 5, 8):
        cases.append(ExactCase(f"gamma={gamma} V=3 n=4", 3, gamma, 4))
        cases.append(ExactCase(f"gamma={gamma} V=6 n=2", 6, gamma, 2))
    for vocab in (2, 3, 4, 5, 6):
        cases.append(ExactCase(f"V={vocab} n=3", vocab, 2, 3 if vocab <= 5 else 2))
    for n in (1, 2, 3, 4):
        cases.append(ExactCase(f"n={n} < gamma=5", 3, 5, n))
    for kind in ("same", "misses-target", "target-misses", "one-hot"):
        cases.append(ExactCase(f"draft {kind}", 4, 3, 3, draft=kind))
    for temperature in (0.0, 0.5, 1.0, 1.7):
        cases.append(ExactCase(f"T={temperature:g}", 4, 3, 3, SamplingSettings(temperature=temperature)))
    transforms = {
        "top_k=2": SamplingSettings(top_k=2),
        "top_p=0.7": SamplingSettings(top_p=0.7),
        "min_p=0.3": SamplingSettings(min_p=0.3),
        "repetition_penalty=1.5": SamplingSettings(repetition_penalty=1.5),
        "logit_bias": SamplingSettings(logit_bias={2: 1.5, 3: -2.0}),
        "presence_penalty=1.5 frequency_penalty=0.8": OUTPUT_PENALTIES,
        "presence_penalty=-2 frequency_penalty=-1.2, T=0.9": REPEATING_PENALTIES,
        "all transforms, T=0.8": ALL_TRANSFORMS,
    }
    for name, settings in transforms.items():
        cases.append(ExactCase(name, 4, 3, 3, settings))
    cases.append(ExactCase("batch of 2, different prompts", 3, 2, 2, prompts=((1,), (2, 1))))
    cases.append(
        ExactCase(
            "batch of 2, rep penalty, n < gamma",
            3,
            3,
            2,
            SamplingSettings(repetition_penalty=1.4, temperature=0.9),
            prompts=((2, 2), (1,)),
        )
    )
    extra = registered_drafter_cases()
    trees = tree_cases() + suffix_tree_cases()
    # Every backend's own cases last (`verify` says which backends are skipped: `skipped_backends`).
    constrained = grammar_cases()
    positioned = positioned_cases()
    return (
        cases
        + round_two_grid()
        + extra
        + trees
        + constrained
        + positioned
        + scheduler_cases()
        + backend_cases()
    )


DRAFTERS_WITH_OWN_CASES = frozenset({"model", "ngram", "hybrid"})
"""Drafters whose cases `round_two_grid` writes out; every other registered drafter gets
`registered_drafter_cases`."""


def registered_drafter_cases() -> list[ExactCase]:
    """The same cases for every drafter of the registry that `round_two_grid` does not spell out, so a
    new drafter is enumerated by `exactspec verify` without an edit here: each verifier, fixed and
    adaptive gamma, a prompt that repeats (drafts from the row's own text), a batch of two rows
    with every transform, and a row after earlier requests (drafts from what they left)."""
    all_transforms = ALL_TRANSFORMS
    cases: list[ExactCase] = []
    for name in drafter_kinds():
        if name in DRAFTERS_WITH_OWN_CASES:
            continue
        for adaptive in (False, True):
            for verifier in VERIFIERS:
                strategy = Strategy(name, verifier, adaptive)
                label = f"{strategy.name} ({name} drafter)"
                cases.append(ExactCase(f"{label}, repeats", 4, 3, 3, prompts=((1, 2, 1),), strategy=strategy))
                if adaptive:  # lengths from the round times, corrected as the enumerated rounds run
                    cases.append(
                        ExactCase(
                            f"{label}, planned from round times",
                            4,
                            3,
                            4,
                            prompts=((1, 2, 1),),
                            strategy=strategy,
                            planned=True,
                        )
                    )
                cases.append(
                    ExactCase(
                        f"{label}, batch of 2, all transforms",
                        4,
                        3,
                        3,
                        all_transforms,
                        prompts=((1, 2, 1), (2,)),
                        strategy=strategy,
                    )
                )
                cases.append(
                    ExactCase(
                        f"{label}, after earlier requests",
                        4,
                        3,
                        3,
                        prompts=((3, 1),),
                        strategy=strategy,
                        previous=((2, 3, 1), (3, 1, 2)),
                    )
                )
    return cases


def tree_cases() -> list[TreeCase]:
    """Trees of deterministic candidates (docs/algorithm.md 5, "Several candidates").

    The trees come from `rotating_tree` (widths[d] children under each node at depth d, ids that
    change with the history): a child equal to EOS, children the target gives p = 0 (a target that
    misses an id, top-k / top-p), every child rejected, whole paths accepted (a bonus after a leaf),
    several levels, every id a child of the root (the last child then holds all of r), width 1 (and
    the same chains through the chain verifier), T = 0 and T = 0.7 with top-k / top-p, the
    repetition, presence and frequency penalties (each node's own history), rows of a batch with
    different trees, and trees cut by the length limit. `tests/verifiers/test_tree.py` checks that
    these events all happen.
    """
    hot_top = SamplingSettings(temperature=0.7, top_k=3, top_p=0.95)
    greedy = SamplingSettings(temperature=0.0)
    # (name, V, gamma, n, widths, other TreeCase fields)
    cells: list[tuple[str, int, int, int, tuple[int, ...], dict]] = [
        ("3 candidates", 4, 1, 3, (3,), {}),
        ("2 x 2", 4, 2, 3, (2, 2), {}),
        ("2-1-1, three levels", 3, 3, 4, (2, 1, 1), {}),
        ("3 x 2, gamma=2 n=2: cut to depth 1", 4, 2, 2, (3, 2), {}),
        ("every id a child of the root", 3, 1, 3, (3,), {}),
        ("target misses an id", 4, 2, 3, (2, 2), {"draft": "target-misses"}),
        ("width 1", 4, 3, 3, (1, 1, 1), {}),
        ("width 1 as chains (token verifier)", 4, 3, 3, (1, 1, 1), {"as_chain": True}),
        ("T=0, batch of 2", 4, 2, 4, (3, 3), {"settings": greedy, "prompts": ((2,), (3, 1))}),
        ("T=0.7 top_k=3 top_p=0.95", 4, 2, 4, (2, 2), {"settings": hot_top}),
        ("repetition_penalty=1.5", 4, 2, 3, (2, 1), {"settings": SamplingSettings(repetition_penalty=1.5)}),
        ("presence and frequency penalties", 4, 2, 3, (2, 1), {"settings": OUTPUT_PENALTIES}),
        (
            "T=0, penalties favouring repeats",
            4,
            2,
            4,
            (2, 2),
            {"settings": GREEDY_REPEATS, "prompts": ((2,), (2, 1, 2))},
        ),
        ("batch of 2, different prompts", 3, 2, 2, (2, 1), {"prompts": ((1,), (2, 1))}),
    ]
    cases = [
        TreeCase(f"tree {name}", vocab, gamma, n, widths=widths, seed=3, **fields)
        for name, vocab, gamma, n, widths, fields in cells
    ]
    return cases


SUFFIX_TREE_OPTIONS = {"max_branches": 3, "max_nodes": 6, "min_token_probability": 0.0, "alpha": 3.0}
"""Suffix drafting with tree drafts (up to 3 continuations per node, 6 nodes) that branch on these tiny
texts: every continuation seen is drafted, however rare."""


def suffix_tree_cases() -> list[ExactCase]:
    """The suffix drafter's tree drafts (`Proposal.parents`) through the shipped builder: a prompt that
    repeats, a batch of two rows with every transform, and a row after earlier requests (drafts from the
    shared tree), with fixed and adaptive gamma. A tree is verified by tree verification whatever the
    strategy's verifier (docs/algorithm.md 5, "Several candidates")."""
    all_transforms = ALL_TRANSFORMS
    cases: list[ExactCase] = []
    for adaptive in (False, True):
        strategy = Strategy("suffix", "token", adaptive, drafter_options=SUFFIX_TREE_OPTIONS)
        label = f"suffix trees{', adaptive gamma' if adaptive else ''}"
        cases += [
            ExactCase(f"{label}, repeats", 4, 3, 3, prompts=((1, 2, 1, 2, 3, 1, 2),), strategy=strategy),
            ExactCase(
                f"{label}, batch of 2, all transforms",
                4,
                3,
                3,
                all_transforms,
                prompts=((1, 2, 1, 3, 1), (2,)),
                strategy=strategy,
            ),
            ExactCase(
                f"{label}, after earlier requests",
                4,
                3,
                3,
                prompts=((3, 1),),
                strategy=strategy,
                previous=((2, 3, 1), (3, 1, 2), (3, 1, 3)),
            ),
        ]
    return cases


def _random_probabilities(vocab: int, seed: int, zeros: int = 0) -> tuple[float, ...]:
    """A random distribution over `vocab` ids (softmax of normal logits), its first `zeros` ids 0."""
    generator = torch.Generator().manual_seed(seed)
    probs = torch.softmax(2.0 * torch.randn(vocab, generator=generator, dtype=torch.float64), dim=0)
    probs[:zeros] = 0.0
    return tuple((probs / probs.sum()).tolist())


def positioned_cases() -> list[ExactCase]:
    """The shipped sampler's draws keyed by position (`checking.positioned`): the law of one draw over a
    random seed at positions near and far, for random, sparse, one-hot and near-zero probabilities; and
    the drafters under token verification (suffix, its trees, prompt lookup, the draft model's coupled
    drafts, the hybrid; fixed, adaptive and planned gamma) giving every seed plain decoding's tokens at
    gamma 1..3."""
    laws = [
        ("V=4, position 0", _random_probabilities(4, 1), 0),
        ("V=6 with zeros, position 7", _random_probabilities(6, 2, zeros=3), 7),
        ("V=1000, position 2^40", _random_probabilities(1000, 3), 1 << 40),
        ("one-hot, position 5", (0.0, 0.0, 1.0, 0.0), 5),
        ("mass 1e-300 below the grid", (1e-300, 0.5, 0.5 - 1e-300), 1),
    ]
    cases: list[ExactCase] = [
        PositionedLawCase(f"positioned draw's law, {name}", len(p), 0, 1, probabilities=p, position=t, seed=i)
        for i, (name, p, t) in enumerate(laws)
    ]
    sampled = SamplingSettings(temperature=0.8, top_k=3, repetition_penalty=1.3)
    drafters = [
        ("suffix", Strategy("suffix", "token", False), False, SamplingSettings()),
        ("suffix, planned gamma", Strategy("suffix", "token", True), True, SamplingSettings()),
        (
            "suffix trees, adaptive gamma",
            Strategy("suffix", "token", True, SUFFIX_TREE_OPTIONS),
            False,
            sampled,
        ),
        ("ngram, all transforms", Strategy("ngram", "token", False), False, ALL_TRANSFORMS),
        ("ngram, planned gamma", Strategy("ngram", "token", True), True, sampled),
        ("coupled model drafts, all transforms", Strategy("model", "token", False), False, ALL_TRANSFORMS),
        ("coupled model drafts, adaptive gamma", Strategy("model", "token", True), False, sampled),
        ("hybrid, planned gamma", Strategy("hybrid", "token", True), True, sampled),
    ]
    for name, strategy, planned, settings in drafters:
        cases.append(
            PointMassCase(
                f"point-mass drafts = plain tokens, {name}",
                4,
                3,
                6,
                settings,
                prompts=((1, 2, 1, 2, 1), (3,)),
                strategy=strategy,
                planned=planned,
            )
        )
    return cases


def round_two_grid() -> list[ExactCase]:
    """Block verification, prompt lookup, the hybrid drafter and adaptive gamma (docs/algorithm.md 5)."""
    return _block_cases() + _lookup_and_adaptive_cases()


def _block_cases() -> list[ExactCase]:
    """Block verification: draft lengths, vocabularies, kinds of draft, each transform, a batch."""
    cases: list[ExactCase] = []
    for gamma in (1, 2, 3, 4, 5):
        cases.append(ExactCase(f"block gamma={gamma} V=3 n=4", 3, gamma, 4, strategy=BLOCK))
    cases.append(ExactCase("block gamma=3 V=6 n=2", 6, 3, 2, strategy=BLOCK))
    for n in (1, 2):
        cases.append(ExactCase(f"block n={n} < gamma=5", 3, 5, n, strategy=BLOCK))
    for kind in ("same", "misses-target", "target-misses", "one-hot", "no-eos"):
        cases.append(ExactCase(f"block draft {kind}", 4, 3, 3, draft=kind, strategy=BLOCK))
    block_transforms = {
        "T=0": SamplingSettings(temperature=0.0),
        "T=1.7": SamplingSettings(temperature=1.7),
        "top_k=2": SamplingSettings(top_k=2),
        "top_p=0.7": SamplingSettings(top_p=0.7),
        "min_p=0.3": SamplingSettings(min_p=0.3),
        "repetition_penalty=1.5": SamplingSettings(repetition_penalty=1.5),
        "logit_bias": SamplingSettings(logit_bias={2: 1.5, 3: -2.0}),
        "presence and frequency penalties": OUTPUT_PENALTIES,
        "all transforms, T=0.8": ALL_TRANSFORMS,
    }
    for name, settings in block_transforms.items():
        cases.append(ExactCase(f"block {name}", 4, 3, 3, settings, strategy=BLOCK))
    cases.append(
        ExactCase("block batch of 2, different prompts", 3, 3, 2, prompts=((1,), (2, 1)), strategy=BLOCK)
    )
    return cases


def _lookup_and_adaptive_cases() -> list[ExactCase]:
    """Prompt lookup (n-gram), the hybrid drafter, adaptive and planned gamma, each under token and block
    verification."""
    all_transforms = ALL_TRANSFORMS
    cases: list[ExactCase] = []
    # (1, 2, 1) repeats from the start; (3,) has no match until the output repeats a token.
    lookup_and_adaptive: list[tuple[str, int, int, int, dict]] = [
        # name ({} = verifier), V, gamma, max_new_tokens, other ExactCase fields
        ("ngram {}, repeats", 4, 3, 3, {"prompts": ((1, 2, 1),), "drafter": "ngram"}),
        ("ngram {}, no match at first", 4, 3, 3, {"prompts": ((3,),), "drafter": "ngram"}),
        (
            "ngram {}, all transforms",
            4,
            3,
            3,
            {"settings": all_transforms, "prompts": ((2, 1, 2),), "drafter": "ngram"},
        ),
        ("ngram {}, batch of 2", 3, 3, 2, {"prompts": ((1, 2, 1), (2,)), "drafter": "ngram"}),
        # Greedy rows with a deterministic draft take `verify_greedy` (no p built): the penalties must
        # still move the argmax, position by position.
        (
            "ngram {}, T=0, penalties favouring repeats",
            4,
            3,
            4,
            {"settings": GREEDY_REPEATS, "prompts": ((2,), (2, 1, 2)), "drafter": "ngram"},
        ),
        (
            "ngram {}, batch of 2, penalties",
            3,
            3,
            3,
            {"settings": REPEATING_PENALTIES, "prompts": ((1, 2, 1, 2), (2,)), "drafter": "ngram"},
        ),
        ("hybrid {}", 4, 3, 3, {"prompts": ((1, 2, 3),), "drafter": "hybrid"}),
        ("hybrid {}, batch of 2", 3, 2, 2, {"prompts": ((1, 2, 1), (2,)), "drafter": "hybrid"}),
        # Adaptive gamma: rows draft 0, 1 and 2 tokens in different rounds (n = 5 leaves room for 2).
        ("adaptive gamma {}, V=3 n=5", 3, 3, 5, {"adaptive": True}),
        ("adaptive gamma {}, batch of 2, V=2", 2, 3, 5, {"prompts": ((1,), (1, 1)), "adaptive": True}),
        (
            "adaptive gamma {}, ngram",
            4,
            4,
            5,
            {"prompts": ((1, 2, 1),), "drafter": "ngram", "adaptive": True},
        ),
        # The planner (decoding.planner, decoding.round_times): draft lengths from round times that the
        # grid's deterministic clock (`grid_round_time`) corrects as the enumerated rounds run.
        ("planned gamma {}, one row, round times", 3, 3, 4, {"adaptive": True, "planned": True}),
        (
            "planned gamma {}, ngram, round times",
            4,
            4,
            4,
            {"prompts": ((1, 2, 1),), "drafter": "ngram", "adaptive": True, "planned": True},
        ),
        # The hybrid under the planner: a row with a suffix chain drafts it or the model, as the plan
        # chooses from both sources' rates and costs; the batch mixes a row with chains and one without.
        (
            "planned gamma {}, hybrid, round times",
            3,
            3,
            4,
            {"prompts": ((1, 2, 1),), "drafter": "hybrid", "adaptive": True, "planned": True},
        ),
        (
            "planned gamma {}, hybrid, batch of 2",
            3,
            2,
            3,
            {"prompts": ((1, 2, 1), (2,)), "drafter": "hybrid", "adaptive": True, "planned": True},
        ),
        (
            "adaptive gamma {}, hybrid, rep=1.4",
            3,
            3,
            5,
            {
                "settings": SamplingSettings(repetition_penalty=1.4),
                "prompts": ((1, 2),),
                "drafter": "hybrid",
                "adaptive": True,
            },
        ),
    ]
    for verifier in ("token", "block"):
        for name, vocab, gamma, n, shared in lookup_and_adaptive:
            options = dict(shared)  # the list is walked once per verifier
            drafter, adaptive = options.pop("drafter", "model"), options.pop("adaptive", False)
            strategy = Strategy(drafter, verifier, adaptive)
            cases.append(ExactCase(name.format(verifier), vocab, gamma, n, strategy=strategy, **options))
    return cases


def scheduler_cases() -> list[ExactCase]:
    """The real scheduler: rows with their own settings, gamma and limits, joining and leaving mid-run."""
    hot = SamplingSettings(temperature=1.3, top_k=2)
    penalised = SamplingSettings(temperature=0.7, repetition_penalty=1.5, logit_bias={2: 0.8})
    greedy = SamplingSettings(temperature=0.0)
    return [
        # Each row's presence and frequency penalties count its own output, from its own prompt's end
        # (the draft model hears the prompt when the row joins: `ModelDrafter.add_rows`).
        ExactCase(
            "scheduler: rows with output penalties join at different rounds",
            3,
            2,
            3,
            schedule=(
                ScheduledRow((1, 1), OUTPUT_PENALTIES, 3),
                ScheduledRow((2,), REPEATING_PENALTIES, 2, joins_after=1),
            ),
        ),
        ExactCase(
            "scheduler: rows with own settings",
            3,
            2,
            2,
            schedule=(ScheduledRow((1,), hot, 2), ScheduledRow((2, 1), penalised, 2, gamma=1)),
        ),
        ExactCase(
            "scheduler: a row joins after round 1",
            3,
            2,
            3,
            schedule=(
                ScheduledRow((1,), SamplingSettings(), 3),
                ScheduledRow((2,), penalised, 2, joins_after=1),
            ),
        ),
        ExactCase(
            "scheduler: one leaves, two join",
            3,
            3,
            2,
            schedule=(
                ScheduledRow((1,), hot, 1),
                ScheduledRow((2,), greedy, 2, joins_after=1),
                ScheduledRow((2, 1), SamplingSettings(temperature=1.2), 2, gamma=0, joins_after=1),
            ),
        ),
        ExactCase(
            "scheduler: batch of 1, a row queues",
            3,
            2,
            2,
            schedule=(ScheduledRow((1,), penalised, 2), ScheduledRow((2,), hot, 2)),
            max_batch=1,
        ),
        # Cost-aware rounds (serve's adaptive gamma): row 0 drafts while alone, nothing once row 1
        # joins, and again after row 1 leaves; row 2 names its own gamma, which the plan keeps.
        ExactCase(
            "scheduler: cost-aware rounds, gamma by batch",
            3,
            2,
            5,
            schedule=(
                ScheduledRow((1,), SamplingSettings(), 3),
                ScheduledRow((2,), hot, 1, joins_after=1),
                ScheduledRow((2, 1), penalised, 2, gamma=1, joins_after=2),
            ),
            strategy=Strategy(drafter="model", adaptive_gamma=True),
            planned=True,
        ),
    ]
