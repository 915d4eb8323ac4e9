"""A served request that names no gamma is planned by the server's policy; one that names its gamma keeps it.

Before the session (issue 29's serving bug) the server gave every request without `gamma` its own
fixed gamma, so the cost-aware planner never planned a served row. Here the pass costs are made up
so that the planner's answer is known: alone, drafting pays (a 3-token block costs 1.2 one-token
passes); with 4 rows in the round, widening the block costs more than it brings, so rows that left
gamma to the server decode plainly, while a row that asked for gamma 2 drafts 2 every round.
"""

from __future__ import annotations

from conftest import TOKENIZER_EOS_ID, TOKENIZER_VOCAB, tiny_causal_lm, tiny_tokenizer

from exactspec.decoding.planner import CostAwareGamma
from exactspec.decoding.strategy import Strategy
from exactspec.foundations.costs import BatchCosts
from exactspec.models.pair import ModelPair
from exactspec.server.schemas import CompletionRequest
from exactspec.server.service import Service

VOCAB = len(TOKENIZER_VOCAB)
COSTS = BatchCosts(
    rows=(1, 4),
    widths=(1, 2, 3),
    target=((1.0, 1.1, 1.2), (1.2, 3.0, 5.0)),
    draft=((0.3, 0.4, 0.5), (0.4, 0.6, 0.8)),
)
NO_EOS = {str(TOKENIZER_EOS_ID): -100.0}


def _service() -> Service:
    target = tiny_causal_lm(vocab_size=VOCAB, seed=0, eos_token_id=TOKENIZER_EOS_ID)
    draft = tiny_causal_lm(vocab_size=VOCAB, seed=1, eos_token_id=TOKENIZER_EOS_ID)
    pair = ModelPair.from_models(target, draft, tokenizer=tiny_tokenizer())
    return Service(
        pair, gamma=2, strategy=Strategy(drafter="model", adaptive_gamma=True), batch_costs=COSTS, max_batch=4
    )


def _body(**fields: object) -> CompletionRequest:
    return CompletionRequest(model="exactspec", prompt="def f(x):", max_tokens=6, logit_bias=NO_EOS, **fields)


def test_a_request_without_gamma_is_planned_by_the_batch_and_one_with_gamma_keeps_it() -> None:
    service = _service()
    assert isinstance(service.scheduler.engine.gamma_policy, CostAwareGamma)
    alone = service.submit(_body(seed=1), lambda choice, event: None)
    service.scheduler.run_until_idle()
    assert alone.statistics()["proposed_tokens"] > 0  # alone, the planner drafts
    assert alone.statistics()["gamma_planned"]

    planned = [service.submit(_body(seed=s), lambda choice, event: None) for s in range(4)]
    service.scheduler.run_until_idle()
    # Four rows: widening every row's block costs more than it brings, so the free rows decode plainly.
    assert [s.statistics()["proposed_tokens"] for s in planned] == [0, 0, 0, 0]

    # A request that names its gamma drafts exactly that, planner or not (the others may then draft
    # too: the target pass is as wide as the fixed row's block anyway).
    fixed = service.submit(_body(seed=9, gamma=2), lambda choice, event: None)
    others = [service.submit(_body(seed=s), lambda choice, event: None) for s in range(3)]
    service.scheduler.run_until_idle()
    statistics = fixed.statistics()
    # Two a round, but the last round's draft fits what the length limit leaves (6 tokens: after 5,
    # the last token is one plain draw).
    assert 2 * (statistics["rounds"] - 1) <= statistics["proposed_tokens"] <= 2 * statistics["rounds"]
    assert statistics["rounds"] > 1
    assert not statistics["gamma_planned"] and statistics["gamma"] == 2
    assert all(s.statistics()["gamma_planned"] for s in others)
