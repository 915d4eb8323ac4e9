"""The report's comparison sections: block against token verification, several candidates against one
chain, adaptive against fixed gamma, transformers' assisted generation, llama-cpp-python's prompt lookup,
onnxruntime-genai's n-gram decoding."""

from __future__ import annotations

from exactspec.bench.formatting import name_title, num, spread_text
from exactspec.bench.methods import HF_ASSISTED, HF_PLAIN, LLAMACPP_LOOKUP, ORTGENAI_NGRAM, label
from exactspec.bench.result import BenchResult
from exactspec.bench.summary_records import BlockSummary, ExpectedTokensPerRound, Summary


def tree_table(summary: Summary) -> list[str]:
    if not summary.tree_vs_chain:
        return []
    lines = [
        "## Several candidates against one chain (same drafts, same p)",
        "",
        "Expected tokens per round of each tree round, walking the whole tree (tree verification) and "
        "walking its first branch alone, which is the chain the drafter proposes with one branch; "
        "both from the same round's p, so chance is out of the comparison.",
        "",
        "| sampling | method | tree rounds | tokens/round, tree | tokens/round, its chain | gain "
        "| median gain over prompts |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for gain in summary.tree_vs_chain:
        lines.append(
            f"| {gain.setting} | {label(gain.method, gain.gamma)} | {gain.tree_rounds} "
            f"| {gain.tree_tokens_per_round:.3f} | {gain.chain_tokens_per_round:.3f} "
            f"| {gain.gain:.3f}x | {gain.median_gain:.3f}x |"
        )
    return lines + [""]


def block_table(summary: Summary) -> list[str]:
    pairs = summary.block_vs_token
    if not pairs:
        return []
    lines = [
        "## Block against token verification (same drafts' model, same gamma, prompt and seed)",
        "",
        *_block_summary(summary.block_summary),
        "| sampling | prompt | gamma | tokens/round, token | tokens/round, block "
        "| expected, token run's rounds: token / block rule / block weights "
        "| expected, block run's rounds: token / block rule / block weights "
        "| tokens/s, token | tokens/s, block | wall-clock gain |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def scored(item: ExpectedTokensPerRound | None) -> str:
        if item is None:
            return "-"
        return f"{item.token:.3f} / {item.block:.3f} / {num(item.block_weights, 3)}"

    for p in pairs:
        lines.append(
            f"| {name_title(p.setting)} | {p.prompt} | {p.gamma} | "
            f"{num(p.token_tokens_per_round)} | {num(p.block_tokens_per_round)} | "
            f"{scored(p.expected_on_token_rounds)} | {scored(p.expected_on_block_rounds)} | "
            f"{num(p.token_tokens_per_second)} | "
            f"{num(p.block_tokens_per_second)} | {num(p.wall_clock_gain, 3)}x |"
        )
    lines += [
        "",
        "tokens/round: what each run emitted (sampled). Both verifiers see the same target forward per "
        "round, but the drafts differ after the first round in which they emit different tokens (at T > 0 "
        "the random streams are then used differently), so sampled differences include chance. expected: "
        "1 + the "
        "expected kept draft tokens per round under each rule, both computed in closed form on the same "
        "rounds (exactspec.verifiers.expected; each run scores both rules on its own drafts and targets, "
        "untimed): the paired comparison, free of the verifiers' coin flips. Block verification's guarantee "
        "is in expectation over the drafts, so a run's rounds can still favour the token rule by chance in "
        "the drafts; at T=0 both rules keep the same tokens. block weights: 1 + the mean sum of block "
        "verification's weights w_1..w_L per round (exactspec.verifiers.expected.block_weight_sum), whose "
        "mean over drafts is the block rule's expected kept tokens as well: it shares the drafts' chance "
        "with the token rule's column and is never below it on any round, so the two measure the size of "
        "the gain with the drafts' noise taken out.",
        "",
    ]
    return lines


def _block_summary(block: BlockSummary | None) -> list[str]:
    """The block-vs-token pairs in a few numbers: sampled gains, the paired expectation, over the drafts."""
    if block is None:
        return []
    lines = [
        f"- {block.pairs} prompt x sampling x gamma pairs: median tokens/round gain "
        f"{num(block.median_tokens_per_round_gain, 3)}x, median wall-clock gain "
        f"{num(block.median_wall_clock_gain, 3)}x (block run / token run; two sampled runs, so chance "
        "is in both)."
    ]
    if block.scorings:
        below = block.expected_below
        lines.append(
            f"- Both rules scored on the same rounds ({block.scorings} scorings, each pair on both runs' "
            f"rounds): the block rule's expected tokens/round above the token rule's in "
            f"{block.expected_ahead}, equal in {block.expected_tied}, below in {len(below)}"
            + (f" ({', '.join(below)})" if below else "")
            + f"; median ratio {num(block.median_expected_gain, 3)}x."
        )
    over = block.over_drafts
    if over:
        lines.append(
            "- Over the drafts (the sum of block verification's weights against the token rule's "
            f"expectation), at the sampled rows: above on {over.ahead_on} of {over.scorings} scorings, "
            f"ratio median {num(over.median_gain, 4)}x [{num(over.min_gain, 4)}, {num(over.max_gain, 4)}]."
        )
    return lines + [""]


def adaptive_table(summary: Summary) -> list[str]:
    """Adaptive gamma against the fixed gamma with the highest median speedup, per sampling row."""
    if not summary.adaptive_vs_fixed:
        return []
    lines = [
        "## Adaptive gamma against the best fixed gamma (draft model, token verification)",
        "",
        "| sampling | adaptive | median speedup | best fixed gamma | its median speedup "
        "| faster than it on (prompts) | median per-prompt ratio |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for item in summary.adaptive_vs_fixed:
        lines.append(
            f"| {name_title(item.setting)} | {item.label} | {num(item.median)}x | "
            f"{item.best_fixed_gamma} | {num(item.best_fixed_median)}x | "
            f"{item.faster_on} of {item.paired_prompts} | {num(item.median_ratio)}x |"
        )
    lines += [
        "",
        "Best fixed gamma: the speculative gamma with the highest median speedup at that sampling row. "
        "The two medians may come from different prompts; the last two columns compare the two methods "
        "prompt by prompt (ratio = adaptive speedup / fixed-gamma speedup on the same prompt).",
        "",
    ]
    return lines


def hf_section(result: BenchResult, summary: Summary) -> list[str]:
    policy = result.hf_policy
    threshold = policy.assistant_confidence_threshold if policy else None
    adaptive = (
        "re-fitted from an ROC curve each round"
        if policy and policy.adaptive_confidence_threshold
        else "fixed: HF re-fits it only when scikit-learn is installed, and it is not"
    )
    lines = [
        "## Hugging Face assisted generation",
        "",
        f"Draft length policy (the assistant's generation config with HF defaults): num_assistant_tokens="
        f"{policy.num_assistant_tokens if policy else None}, schedule "
        f"`{policy.num_assistant_tokens_schedule if policy else None}`, "
        f"assistant_confidence_threshold={threshold} ({adaptive}): the draft stops early when its own "
        "probability of the token it drew falls below the threshold. It runs stock transformers, as its "
        "users run it: the loaded modules with their dense weights and transformers' own attention "
        "(our engine runs its own copies, packed when --weights says). Same prompts, seeds and number "
        "of new tokens; the same sampling settings as our runs of each row.",
        "",
        "| sampling | generator | rounds | mean draft length | draft lengths used (length: rounds) | alpha "
        "| tokens/round | tokens/s | speedup over our plain | speedup over HF plain |",
        "|---:|---|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in summary.rows:
        if r.method != HF_ASSISTED:
            continue
        histogram = ", ".join(f"{k}: {n}" for k, n in (r.hf_draft_lengths or {}).items())
        lines.append(
            f"| {name_title(r.setting)} | {', '.join(r.hf_generator)} | "
            f"{'' if r.rounds is None else r.rounds} | "
            f"{num(r.hf_mean_draft_length, 1)} | {histogram} | {num(r.alpha, 3)} | "
            f"{num(r.tokens_per_round)} | {num(r.tokens_per_second.median)} | "
            f"{spread_text(r.speedup)} | {spread_text(r.speedup_over_hf_plain)} |"
        )
    for r in summary.rows:
        if r.method == HF_PLAIN:
            lines.append(
                f"\nHF plain `generate` at {name_title(r.setting)}: {num(r.tokens_per_second.median)} "
                f"tokens/s, {spread_text(r.speedup)} x our plain decoding."
            )
    return lines + [""]


LOOKUP_NOTE = (
    "llama-cpp-python's prompt lookup decoding, run as its README shows it: `Llama(..., draft_model="
    "LlamaPromptLookupDecoding(num_pred_tokens=N))` with `Llama.generate`. Each round the draft model "
    "proposes up to N tokens that follow the first earlier occurrence of the last 2 (else 1) tokens "
    "(fewer when the history ends sooner), none when nothing matches; one `Llama.eval` scores the pending "
    "token and the proposal; llama.cpp's "
    "sampler chain then samples position by position and keeps a proposed token when the token it sampled "
    "there equals it; the first that differs is emitted in its place and ends the round. With a "
    "deterministic proposal every emitted token is the sampler's own draw from the target given the "
    "tokens before it, so this keeps plain sampling's law at every temperature (not only greedy; "
    "tests/audit/test_audit_llamacpp.py: with the same seed it emits plain decoding's very tokens, and "
    "`exactspec audit --backend llamacpp --generator llamacpp-lookup` tests it), up to the numerics of "
    "a k-token pass; a position's acceptance is p(proposed token). Its sampler chain is llama.cpp's "
    "(penalties over the generated tokens, top-k, top-p, min-p before the temperature), not ours."
)


def lookup_section(summary: Summary) -> list[str]:
    """llama-cpp-python's prompt lookup decoding: how it drafts and keeps, its rounds and acceptance."""
    title = "## llama.cpp prompt lookup decoding (LlamaPromptLookupDecoding)"
    return _peer_rounds_section(summary, LLAMACPP_LOOKUP, title, LOOKUP_NOTE)


NGRAM_NOTE = (
    "onnxruntime-genai's n-gram speculative decoding on the ONNX model folder, run as its "
    "docs/SpeculativeDecoding.md starts it: `GeneratorParams.set_speculative_options(ngram_size=3, "
    "max_draft_tokens=N)` (fixed width) with `Generator.generate_next_token`. Each round proposes up to N "
    "tokens that followed the most recent earlier occurrence of the last 2 committed tokens "
    "(`NGramLookup`); a miss runs one standard step (a proposal of 0 here). One target pass scores the "
    "proposal; greedy keeps a proposed token while it is the argmax; sampled, "
    "`VerifyDeterministicProposal` draws the target's token at each position from p and keeps the "
    "proposal while the draw equals it, the first draw that differs ending the round. For a deterministic "
    "proposal that is Leviathan et al.'s rule exactly (accept with p(x), else draw from p without x), so "
    "it keeps plain sampling's law at every temperature, up to the numerics of a k-token pass "
    "(exactspec/peers/ortgenai.py has the source references). Its rounds are read from the generator's "
    "statistics after each token; its sampler is the generator's (repetition penalty, top-k, top-p, "
    "temperature; no min-p), not ours."
)


def ngram_section(summary: Summary) -> list[str]:
    """onnxruntime-genai's n-gram decoding: how it drafts and keeps, its rounds and acceptance."""
    title = "## onnxruntime-genai n-gram decoding (NGramDecodingStrategy)"
    return _peer_rounds_section(summary, ORTGENAI_NGRAM, title, NGRAM_NOTE)


def _peer_rounds_section(summary: Summary, method: str, title: str, note: str) -> list[str]:
    """A peer's speculative method: `note` on how it drafts and keeps, then its rounds and acceptance."""
    lines = [
        title,
        "",
        note,
        "",
        "| sampling | method | rounds | mean proposal | proposal lengths (length: rounds) | alpha "
        "| tokens/round | tokens/s | over fastest plain |",
        "|---:|---|---:|---:|---|---:|---:|---:|---:|",
    ]
    for r in summary.rows:
        if r.method != method:
            continue
        histogram = ", ".join(f"{k}: {n}" for k, n in (r.hf_draft_lengths or {}).items())
        over = r.over_fastest_plain
        lines.append(
            f"| {name_title(r.setting)} | {r.label} | {'' if r.rounds is None else r.rounds} | "
            f"{num(r.hf_mean_draft_length, 1)} | {histogram} | {num(r.alpha, 3)} | "
            f"{num(r.tokens_per_round)} | {num(r.tokens_per_second.median)} | "
            f"{spread_text(over) if over else '-'} |"
        )
    return lines + [""]
