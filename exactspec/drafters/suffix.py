"""Suffix drafting: drafts read from counted continuations of the text so far and of earlier requests.

SuffixDecoding (Oliaro, Jia, Campos, Qiao; arXiv 2411.04975; vLLM's method "suffix" through
Snowflake's Arctic Inference) drafts with no model at all. Each row keeps a suffix tree over its
prompt and its output so far; one *global* tree, shared by every row of the drafter, holds the
outputs of earlier requests. Each round the drafter finds the longest suffix of the row's history
(up to `max_depth` tokens) that occurred before with a continuation, in each tree, and follows the
most frequent continuation (count of a child / count of all children) while the cumulative
probability stays at or above `min_token_probability`, for at most alpha x the match length
tokens. The tree (row or global) whose draft has the larger expected number of accepted tokens
(the sum of the drafted tokens' probabilities) wins. With `max_branches` > 1 the draft is a small
tree: the next most frequent continuations become sibling branches, best first.

The structures are updated as the text grows: `add_rows` indexes a joining row's prompt
(`RowStart.prompt`), `observe` appends each round's new tokens, `release_rows` moves the row's
output into the global tree; `propose` only reads (it checks a few tokens of each history against
what it was told, and catches up on whatever it was not told). `exactspec.drafters.suffix_tree`
holds the data structure, path-compressed, so memory grows with the text held, not with its depth.

Exactness. The draft is deterministic (q one-hot on the proposed tokens; trees too), so
verification accepts X with probability p(X) and otherwise draws from p with X removed
(docs/algorithm.md 5): each position emits from p whatever chose X. What chooses X here is the
row's history and text from finished rounds and finished requests only, never this round's p or
its random draws, so every round is exact and a row's output *law* is the target's. With coupled
verification a seeded row emits plain decoding's very tokens whatever the global tree learned, up to
the float rounding by which a pass of several positions can differ from one-token passes
(docs/numerics.md). Time and memory per token, and the garbage collector's pauses over a large
global tree (each node is a Python object): docs/performance.md, "Suffix trees".
"""

from __future__ import annotations

from array import array
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from exactspec.drafters.base import LookupChain, Proposal
from exactspec.drafters.ngram import MatchLengths
from exactspec.drafters.registry import DrafterKind, DrafterOption, DrafterParts, register
from exactspec.drafters.suffix_tree import Locus, Speculation, SuffixTree, TreeMemory
from exactspec.drafters.texts import RowTexts
from exactspec.foundations.rows import RowStart
from exactspec.foundations.sampler import Sampler
from exactspec.foundations.settings import SamplingSettings

DEFAULT_MAX_DEPTH = 16
"""Longest history suffix matched. With alpha 1 a draft is at most as long as its match, so 16 allows
drafts of 16, twice the draft lengths our 2-core CPUs pay for; deeper matches add update cost
(each appended token touches max_depth + max_spec_tokens nodes) for drafts the verifier would cut."""

DEFAULT_ALPHA = 1.0
"""Draft at most alpha x match length tokens: SuffixDecoding's and Arctic Inference's default
(max_spec_factor 1): a 2-token match is weak evidence, a 12-token match usually the span being
copied."""

DEFAULT_MAX_SPEC_TOKENS = 16
"""Cap on one draft's length (a tree's depth) whatever the match; the row's own max_tokens (its gamma
and room) usually binds first."""

DEFAULT_MIN_TOKEN_PROBABILITY = 0.1
"""Stop drafting when the estimated probability of the whole draft so far falls below this: Arctic
Inference's default. A deterministic draft costs one target position per token, so a token
kept one time in ten is about what a free draft may spend a position on."""

DEFAULT_GLOBAL_BUDGET_TOKENS = 200_000
"""Tokens of earlier requests the global tree keeps (oldest finished request evicted first): small beside a
model at what a token costs (docs/performance.md, "Suffix trees"), and a few hundred answers of a server's
recent traffic."""

DEFAULT_MAX_NODES = 16
"""Nodes in a tree draft (max_branches > 1): the target scores every node, so a tree of 16 costs what
a chain of 16 does."""


@dataclass(frozen=True)
class SuffixDraft:
    """One row's draft and where it came from.

    tokens/parents/probabilities as in `suffix_tree.Speculation` (parents [-1, 0, 1, ...] for a
    chain); match_length: the matched suffix's length (0: no draft); source: the tree it came from.
    """

    speculation: Speculation
    match_length: int
    source: Literal["row", "global", "none"]

    @property
    def tokens(self) -> tuple[int, ...]:
        return self.speculation.tokens

    @property
    def parents(self) -> tuple[int, ...]:
        return self.speculation.parents


NO_DRAFT = SuffixDraft(Speculation(), 0, "none")

MAX_MATCH_ORDER = 8
"""Under adaptive gamma, match lengths from 1 to this many tokens each learn their own draft depth
(`LookupGamma`); longer matches share the last: by then a match is the very span being repeated."""


@dataclass(frozen=True)
class SuffixMemory:
    """What a `SuffixDrafter` holds: its global tree, and all live rows' trees together."""

    global_tree: TreeMemory
    rows: TreeMemory


class RowTree:
    """One row's suffix tree over its prompt and output (the tree's sequence 0, open): a `TextIndex`."""

    __slots__ = ("tree",)

    def __init__(self, depth: int, tokens: Sequence[int]) -> None:
        self.tree = SuffixTree(depth)
        self.tree.extend(0, tokens)

    @property
    def tokens(self) -> array:
        return self.tree.tokens(0)

    def __len__(self) -> int:
        return len(self.tree.tokens(0))

    def tail(self, start: int, stop: int) -> list[int]:
        return self.tree.tokens(0)[start:stop].tolist()

    def extend(self, tokens: Sequence[int]) -> None:
        self.tree.extend(0, tokens)


class SuffixDrafter:
    """A `Drafter` proposing continuations counted in the row's own text and in earlier requests' outputs.

    Options (module docstring for the method and its exactness):

    - max_depth (16): longest history suffix matched (`DEFAULT_MAX_DEPTH` says why).
    - alpha (1.0): a draft is at most alpha x the match length.
    - max_spec_tokens (16): cap on a draft's length (a tree's depth); the row's max_tokens also caps it.
    - min_token_probability (0.1): drafting stops when the draft's estimated probability (the product
      of each step's count(child) / count(all children)) would fall below this.
    - global_budget_tokens (200,000): tokens of finished requests kept for every row to draft from;
      past it the least recently finished request is evicted (its counts removed). A request's last
      use is taken to be when it finished: the tree pools counts, so it cannot tell which earlier
      request a draft came from, and evicting in the order requests were added is also what keeps
      removal exact (`suffix_tree`). 0: no global tree (rows draft from their own text only).
    - global_prompts (False): also put finished requests' prompts in the global tree. Off as in
      SuffixDecoding: a row's own prompt is in its row tree already, and other requests' prompts
      would fill the budget with text no answer was drawn from; on for traffic that repeats whole
      prompts (agents re-sending a conversation).
    - max_branches (1): continuations tried at each node. 1 drafts a chain (any verifier); more drafts a
      tree (`Proposal.parents`): the chain first, then the next most frequent continuations as its
      siblings, best first by estimated probability, verified by tree verification (`verifiers.tree`:
      the engine walks every proposal with parents that way, whatever the strategy's verifier).
    - max_nodes (16): nodes in a tree draft (unused for chains).

    A row keeps its tree while it lives; `memory()` reports both kinds of tree.

    `learns_across_requests`: one drafter serves every request and learns from the finished ones, so
    a benchmark keeps one per method (`bench.runs.LearnedDrafters`), as a server does.

    >>> drafter = SuffixDrafter(eos_token_ids={0})
    >>> drafter.add_rows([RowStart(0, prompt=(3, 4, 5, 6, 9, 3, 4, 5))])
    >>> drafter.propose([[3, 4, 5, 6, 9, 3, 4, 5]], [8], SamplingSettings(), None, [0]).row_tokens(0)
    [6, 9, 3]
    """

    learns_across_requests = True

    def __init__(
        self,
        eos_token_ids: Collection[int],
        *,
        max_depth: int = DEFAULT_MAX_DEPTH,
        alpha: float = DEFAULT_ALPHA,
        max_spec_tokens: int = DEFAULT_MAX_SPEC_TOKENS,
        min_token_probability: float = DEFAULT_MIN_TOKEN_PROBABILITY,
        global_budget_tokens: int = DEFAULT_GLOBAL_BUDGET_TOKENS,
        global_prompts: bool = False,
        max_branches: int = 1,
        max_nodes: int = DEFAULT_MAX_NODES,
        lengths: MatchLengths | None = None,
    ) -> None:
        """`lengths`: if given (`exactspec.decoding.gamma.LookupGamma` under adaptive gamma), a draft whose
        match has length n keeps only the nodes at most `lengths.length_for(row, min(n, MAX_MATCH_ORDER))`
        deep: how far a match of that length is worth scoring is learned per row and match length.
        The other arguments: the class docstring."""
        if max_depth < 1 or max_spec_tokens < 1:
            raise ValueError(
                f"max_depth and max_spec_tokens must be >= 1, got {max_depth}, {max_spec_tokens}"
            )
        if alpha <= 0:
            raise ValueError(f"alpha must be > 0 (draft length per matched token), got {alpha}")
        if not 0.0 <= min_token_probability <= 1.0:
            raise ValueError(f"min_token_probability must be in [0, 1], got {min_token_probability}")
        if global_budget_tokens < 0:
            raise ValueError(
                f"global_budget_tokens must be >= 0 (0: no global tree), got {global_budget_tokens}"
            )
        if max_branches < 1 or max_nodes < 1:
            raise ValueError(f"max_branches and max_nodes must be >= 1, got {max_branches}, {max_nodes}")
        self.eos_token_ids = frozenset(eos_token_ids)
        self.max_depth = max_depth
        self.alpha = alpha
        self.max_spec_tokens = max_spec_tokens
        self.min_token_probability = min_token_probability
        self.global_budget_tokens = global_budget_tokens
        self.global_prompts = global_prompts
        self.max_branches = max_branches
        self.max_nodes = max_nodes
        self.lengths = lengths
        # A match of up to max_depth tokens must leave room below it for a whole draft.
        self.tree_depth = max_depth + max_spec_tokens
        self.global_tree = SuffixTree(self.tree_depth)
        self._rows: RowTexts[RowTree] = RowTexts(lambda tokens: RowTree(self.tree_depth, tokens))
        self._next_request = 0

    # ------------------------------------------------------------------ row lifecycle

    def add_rows(self, rows: Sequence[RowStart]) -> None:
        """Index each joining row's prompt (a row without one is indexed from its first history)."""
        self._rows.add_rows(rows)

    def observe(self, appended: Mapping[int, Sequence[int]]) -> None:
        """Append each row's new tokens to its tree."""
        self._rows.observe(appended)

    def release_rows(self, rows: Sequence[int]) -> None:
        """The rows left: their output (and prompt, with global_prompts) goes into the global tree."""
        for row in rows:
            text = self._rows.pop(row)
            if text is not None:
                self.learn(text.index.tokens[0 if self.global_prompts else text.prompt_length :])

    def learn(self, tokens: Sequence[int]) -> None:
        """Put one finished request's text into the global tree, evicting the oldest requests past the budget
        (a text longer than the whole budget keeps its last global_budget_tokens tokens)."""
        budget = self.global_budget_tokens
        if budget == 0 or len(tokens) == 0:
            return
        tokens = tokens[len(tokens) - budget :] if len(tokens) > budget else tokens
        while self.global_tree.tokens_held + len(tokens) > budget:
            self.global_tree.remove(self.global_tree.sequences[0])
        self.global_tree.add(self._next_request, tokens)
        self._next_request += 1

    def shared_state(self) -> dict[str, int]:
        """`drafters.base.SharedState`: the tokens of finished requests the global tree holds."""
        return {"suffix_global_tokens": self.global_tree.tokens_held}

    def memory(self) -> SuffixMemory:
        """Tokens, nodes and approximate bytes of the global tree and of the live rows' trees."""
        rows = [text.index.tree.memory() for text in self._rows]
        return SuffixMemory(
            self.global_tree.memory(),
            TreeMemory(
                sum(m.tokens for m in rows),
                sum(m.sequences for m in rows),
                sum(m.nodes for m in rows),
                sum(m.approx_bytes for m in rows),
            ),
        )

    # ------------------------------------------------------------------ drafting

    def propose(
        self,
        histories: Sequence[Sequence[int]],
        max_tokens: Sequence[int],
        settings: SamplingSettings | Sequence[SamplingSettings],
        sampler: Sampler,
        rows: Sequence[int],
    ) -> Proposal:
        # No randomness and no model: settings and sampler are not needed. The transforms still apply,
        # through p: a drafted token the transforms rule out (p = 0) is simply rejected.
        del settings, sampler
        drafts = [
            self._cut(row, self.draft(row, history, limit))
            for history, limit, row in zip(histories, max_tokens, rows, strict=True)
        ]
        if self.max_branches > 1:
            return Proposal.from_trees([d.tokens for d in drafts], [d.parents for d in drafts])
        return Proposal.from_chains([draft.tokens for draft in drafts])

    def lookup(self, row: int, history: Sequence[int], limit: int) -> LookupChain:
        """`base.ChainLookup`: the draft's first chain (all of it when max_branches is 1), cut to the depth
        its match length earns, and that match length."""
        draft = self._cut(row, self.draft(row, history, limit))
        chain: list[int] = []
        for token, parent in zip(draft.speculation.tokens, draft.speculation.parents, strict=True):
            if parent != len(chain) - 1:
                break  # a sibling: the first chain ended
            chain.append(token)
        return LookupChain(chain, min(draft.match_length, MAX_MATCH_ORDER))

    def _cut(self, row: int, draft: SuffixDraft) -> SuffixDraft:
        """The draft cut to the depth `lengths` gives its match length (the draft itself without `lengths`).

        The depth depends on the row's finished rounds and the match length only, so the round stays
        exact (docs/algorithm.md 5)."""
        if self.lengths is None or draft.match_length == 0:
            return draft
        depth_limit = self.lengths.length_for(row, min(draft.match_length, MAX_MATCH_ORDER))
        spec = draft.speculation
        depths: list[int] = []
        for parent in spec.parents:
            depths.append(1 if parent < 0 else depths[parent] + 1)
        keep = [n for n, depth in enumerate(depths) if depth <= depth_limit]  # ancestors are kept first
        index = {old: new for new, old in enumerate(keep)}
        cut = Speculation(
            tuple(spec.tokens[n] for n in keep),
            tuple(-1 if spec.parents[n] < 0 else index[spec.parents[n]] for n in keep),
            tuple(spec.probabilities[n] for n in keep),
        )
        return SuffixDraft(cut, draft.match_length, draft.source)

    def draft(self, row: int, history: Sequence[int], max_tokens: int) -> SuffixDraft:
        """Row `row`'s draft after `history` (at most max_tokens deep): the better of its own tree's and
        the global tree's (module docstring)."""
        if max_tokens <= 0:
            return NO_DRAFT
        text = self._rows.sync(row, history).index
        best = NO_DRAFT
        local = self._row_match(text)
        if local is not None:
            best = self._speculate(text.tree, *local, max_tokens, "row")
        if self.global_tree.tokens_held:
            shared = self._global_match(text)
            if shared is not None:
                candidate = self._speculate(self.global_tree, *shared, max_tokens, "global")
                if candidate.speculation.score > best.speculation.score:
                    best = candidate
        return best

    def _row_match(self, text: RowTree) -> tuple[Locus, int] | None:
        """The longest suffix of the row's text, up to max_depth, that occurred earlier with a continuation.

        The tree already holds the node of each of its last suffixes, so no walk is needed; the
        suffix's own occurrence (at the very end) has no continuation and so adds nothing to the
        children it is scored by.
        """
        for length in range(min(self.max_depth, len(text)), 0, -1):
            locus = text.tree.active_locus(0, length)
            if locus is not None and SuffixTree.continues(locus):
                return locus, length
        return None

    def _global_match(self, text: RowTree) -> tuple[Locus, int] | None:
        """The longest suffix of the row's text, up to max_depth, that earlier requests continued."""
        tokens = text.tokens
        for length in range(min(self.max_depth, len(tokens)), 0, -1):
            locus = self.global_tree.locate(tokens[len(tokens) - length :])
            if locus is not None and SuffixTree.continues(locus):
                return locus, length
        return None

    def _speculate(
        self,
        tree: SuffixTree,
        locus: Locus,
        match_length: int,
        max_tokens: int,
        source: Literal["row", "global"],
    ) -> SuffixDraft:
        depth = min(max_tokens, self.max_spec_tokens, int(self.alpha * match_length + 1e-9))
        if depth <= 0:
            return NO_DRAFT
        speculation = tree.speculate(
            locus,
            depth,
            min_probability=self.min_token_probability,
            max_branches=self.max_branches,
            max_nodes=self.max_nodes if self.max_branches > 1 else depth,
            eos_token_ids=self.eos_token_ids,
        )
        return SuffixDraft(speculation, match_length, source) if speculation.tokens else NO_DRAFT


def _build(parts: DrafterParts) -> SuffixDrafter:
    return SuffixDrafter(parts.target.eos_token_ids, lengths=parts.lengths, **parts.options)


KIND = register(
    DrafterKind(
        name="suffix",
        method="suffix",
        summary="suffix trees over the prompt, the output so far and earlier requests' outputs, shared by "
        "every request (SuffixDecoding): repetitive work (agents rewriting files, batch jobs sharing "
        "templates, code edits, extraction into a fixed format); no draft model loaded",
        needs_draft_model=False,
        free=True,
        build=_build,
        max_match_order=lambda options: MAX_MATCH_ORDER,
        options=(
            DrafterOption("max_depth", int, DEFAULT_MAX_DEPTH, "longest history suffix matched"),
            DrafterOption("alpha", float, DEFAULT_ALPHA, "draft at most alpha x the match length"),
            DrafterOption("max_spec_tokens", int, DEFAULT_MAX_SPEC_TOKENS, "longest draft"),
            DrafterOption(
                "min_token_probability",
                float,
                DEFAULT_MIN_TOKEN_PROBABILITY,
                "stop drafting where the continuation's estimated probability falls below this",
            ),
            DrafterOption(
                "global_budget_tokens",
                int,
                DEFAULT_GLOBAL_BUDGET_TOKENS,
                "tokens of earlier requests the shared tree holds (0: none)",
            ),
            DrafterOption("global_prompts", bool, False, "put prompts, not only outputs, in the shared tree"),
            DrafterOption("max_branches", int, 1, "candidates per node (1: one chain; more: a tree)"),
            DrafterOption("max_nodes", int, DEFAULT_MAX_NODES, "most nodes of a tree draft"),
        ),
        rank=3,
    )
)
