"""The repetitive workloads: each edit request carries the previous answer, extraction shares a template."""

from __future__ import annotations

import pytest

from exactspec.bench.prompts import select_prompts
from exactspec.bench.runs import LearnedDrafters
from exactspec.bench.workloads import (
    EDITS,
    Edit,
    apply_edits,
    colorsys_source,
    edit_prompts,
    extraction_prompts,
)
from exactspec.decoding.strategy import Strategy
from exactspec.drafters.ngram import NgramDrafter
from exactspec.drafters.suffix import SuffixDrafter
from exactspec.foundations.settings import SamplingSettings


def _module_in(prompt_text: str) -> str:
    return prompt_text.split("```python\n", 1)[1].split("```", 1)[0]


def test_each_edit_request_pastes_the_module_as_the_previous_edit_left_it() -> None:
    prompts = edit_prompts()
    assert len(prompts) == len(EDITS) and all(p.chat and p.category == "edits" for p in prompts)
    assert _module_in(prompts[0].text) == colorsys_source()
    for k in range(1, len(prompts)):
        before, after = _module_in(prompts[k - 1].text), _module_in(prompts[k].text)
        assert after == apply_edits(before, EDITS[k - 1 : k]) and after != before  # every edit changes it
        assert EDITS[k].instruction in prompts[k].text


def test_an_edit_that_does_not_apply_is_an_error_naming_it() -> None:
    with pytest.raises(RuntimeError, match="rename nothing"):
        apply_edits("text", (Edit("rename nothing", (("absent", "x"),)),))


def test_extraction_requests_share_one_instruction_and_differ_in_their_record() -> None:
    prompts = extraction_prompts()
    instructions = {p.text.split("Status line:")[0] for p in prompts}
    records = {p.text.split("Status line:")[1] for p in prompts}
    assert len(prompts) >= 10 and len(instructions) == 1 and len(records) == len(prompts)


def test_repetitive_selects_both_workloads_in_request_order() -> None:
    chosen = select_prompts("repetitive")
    assert [p.name for p in chosen] == [p.name for p in edit_prompts() + extraction_prompts()]
    assert [p.name for p in select_prompts("edits", quick=True)] == ["edit-colorsys-1", "edit-colorsys-2"]


def test_a_method_name_carries_drafter_options_both_ways() -> None:
    strategy = Strategy.from_name("suffix[max_branches=4]")
    assert strategy.options["max_branches"] == 4 and strategy.name == "suffix[max_branches=4]"
    assert Strategy.from_name(strategy.name) == strategy
    with pytest.raises(ValueError, match="NAME=VALUE"):
        Strategy.from_name("suffix[max_branches]")
    with pytest.raises(ValueError, match="no option"):
        Strategy.from_name("suffix[colour=red]")


class _Engine:
    def __init__(self, drafter) -> None:
        self.drafter = drafter


def test_learned_drafters_keep_one_suffix_drafter_per_method_and_settings_only() -> None:
    learned, settings = LearnedDrafters(), SamplingSettings(temperature=0.7)
    suffix = Strategy(drafter="suffix")
    first, second = _Engine(SuffixDrafter({0})), _Engine(SuffixDrafter({0}))
    learned.use(first, suffix, 8, settings)
    learned.use(second, suffix, 8, settings)
    assert second.drafter is first.drafter  # the second run drafts with what the first learned
    other = _Engine(SuffixDrafter({0}))
    learned.use(other, suffix, 8, SamplingSettings(temperature=0.0))
    assert other.drafter is not first.drafter  # another sampling row has its own
    lookup = [_Engine(NgramDrafter({0})), _Engine(NgramDrafter({0}))]
    for engine in lookup:
        learned.use(engine, Strategy(drafter="ngram"), 8, settings)
    assert lookup[0].drafter is not lookup[1].drafter  # no memory across requests: fresh each run


def test_a_learned_adaptive_suffix_drafter_drafts_in_each_new_engine_with_that_engine_s_policy() -> None:
    # A bench run builds one engine per prompt; the kept drafter must ask the new engine's gamma
    # policy (whose rows the new engine adds), or the second prompt fails ("row 1 was not added").
    from exactspec.checking.toy import random_tabular_model
    from exactspec.decoding.builder import build_engine
    from exactspec.decoding.engine import DecodeConfig
    from exactspec.foundations.costs import CostModel
    from exactspec.foundations.sampler import SeededSampler

    target = random_tabular_model(5, seed=1)
    strategy, settings = Strategy(drafter="suffix", adaptive_gamma=True), SamplingSettings(temperature=0.0)
    costs = CostModel.linear(0.0, 0.1, max_gamma=8)
    learned, prompts, drafters = LearnedDrafters(), ([1, 2, 3, 1, 2, 3], [1, 2, 3, 1, 2], [4, 1, 2]), []
    for prompt in prompts:
        engine = build_engine(target, None, strategy, 8, costs=costs)
        learned.use(engine, strategy, 8, settings)
        drafters.append(engine.drafter)
        assert engine.drafter.lengths is engine.gamma_policy
        engine.generate([prompt, prompt[::-1]], DecodeConfig(8, 10, settings), SeededSampler(0, num_rows=2))
    assert drafters[0] is drafters[1] is drafters[2]
