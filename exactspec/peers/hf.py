"""The peer: transformers' own `generate`, plain or assisted by the draft, driven exactly as we decode.

One code path for the benchmark (which times it) and the audit (which
samples it). Every sampling field is set explicitly from our
`SamplingSettings`, because `generate` fills unset fields from the model's
generation config and then from global defaults (top_k=50 among them); the
models' own generation configs are swapped out for the duration
(`isolated_generation_configs`).

Draft-length policy of the assistant: `assistant_gamma=None` keeps
transformers' own policy (the draft model's generation config: by default 20
assistant tokens, a confidence threshold, possibly a schedule), which is what a
user of assisted generation gets; an integer proposes exactly that many tokens
per round (constant schedule, no confidence stop), which is what an audit at a
given gamma needs.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Collection, Iterator
from typing import Any

import torch

from exactspec.foundations.settings import SamplingSettings


def generation_config(
    settings: SamplingSettings,
    max_new_tokens: int,
    eos_token_ids: Collection[int] | None,
    pad_token_id: int,
) -> Any:
    """A `GenerationConfig` whose logits processors are exactly `settings` (HF's order, HF's definitions).

    `eos_token_ids=None`: no EOS stops generation (it always runs to `max_new_tokens`).
    Nothing but EOS and the length limit can stop generation.
    """
    from transformers import GenerationConfig

    if settings.constraint is not None:  # a peer runs as its users run it: no exactspec constraint
        raise ValueError(
            "transformers' generate is not given exactspec's token constraints; compare it unconstrained"
        )

    if settings.penalises_output:
        raise ValueError("transformers' generate has no presence or frequency penalty (OpenAI's)")
    bias = [[[int(token)], float(value)] for token, value in sorted(settings.logit_bias.items())]
    return GenerationConfig(
        do_sample=not settings.greedy,
        temperature=1.0 if settings.greedy else settings.temperature,
        top_k=settings.top_k,  # 0 = off; None would become the global default 50
        top_p=settings.top_p,
        min_p=settings.min_p if settings.min_p > 0 else None,
        typical_p=1.0,
        epsilon_cutoff=0.0,
        eta_cutoff=0.0,
        repetition_penalty=settings.repetition_penalty,
        sequence_bias=bias or None,
        no_repeat_ngram_size=0,
        max_new_tokens=max_new_tokens,
        min_new_tokens=0,
        min_length=0,
        eos_token_id=None if eos_token_ids is None else sorted(int(t) for t in eos_token_ids),
        pad_token_id=int(pad_token_id),
        num_beams=1,
        num_return_sequences=1,
        use_cache=True,
        renormalize_logits=False,
        remove_invalid_values=False,
    )


def assistant_config(gamma: int) -> Any:
    """The assistant's own generation config: exactly gamma draft tokens per round, nothing adaptive."""
    from transformers import GenerationConfig

    return GenerationConfig(
        num_assistant_tokens=gamma,
        num_assistant_tokens_schedule="constant",
        assistant_confidence_threshold=0.0,  # 0 turns off the early stop on a low-confidence draft token
    )


def draft_policy(draft_model: Any) -> dict[str, Any]:
    """transformers' own draft-length policy for this draft: its generation config, else the defaults."""
    config = draft_model.generation_config
    defaults_fn = getattr(type(config), "_get_default_generation_params", None)
    defaults = defaults_fn() if callable(defaults_fn) else {}

    def value(name: str) -> Any:
        own = getattr(config, name, None)
        return own if own is not None else defaults.get(name)

    try:
        import sklearn  # noqa: F401

        adaptive = True
    except ImportError:
        adaptive = False
    return {
        "num_assistant_tokens": value("num_assistant_tokens"),
        "num_assistant_tokens_schedule": value("num_assistant_tokens_schedule"),
        "assistant_confidence_threshold": value("assistant_confidence_threshold"),
        # HF re-fits the confidence threshold from an ROC curve only when scikit-learn is installed.
        "adaptive_confidence_threshold": adaptive,
    }


def pad_token_id(model: Any, eos_token_ids: Collection[int] = ()) -> int:
    """The id transformers writes after a row's EOS: the model's pad id, else the smallest EOS id, else 0.

    Its value never changes what is generated (rows are cut at their first EOS); it only has to be a
    valid id.
    """
    for source in (model.generation_config, model.config):
        value = getattr(source, "pad_token_id", None)
        if isinstance(value, int):
            return value
    return min(eos_token_ids) if eos_token_ids else 0


def config_vocab(model: Any) -> int:
    """The vocabulary size in the model's config (what transformers compares to decide 'same tokenizer')."""
    return int(model.config.get_text_config().vocab_size)


@contextlib.contextmanager
def isolated_generation_configs(*pairs: tuple[Any, Any]) -> Iterator[None]:
    """Give each model (model, config) the given generation config for the duration, then restore its own.

    A loaded model's `generation_config` (Qwen2.5-Instruct ships temperature,
    top_p, top_k and repetition_penalty) would otherwise fill every field the
    request leaves unset, on the target and on the assistant. A config of None
    keeps the model's own for the duration but still restores it afterwards (a
    "heuristic" schedule writes its draft length back into it). transformers'
    warnings are silenced meanwhile: assisted generation warns about its own
    internal calls on every round.
    """
    from transformers.utils import logging as hf_logging

    saved = [model.generation_config for model, _ in pairs]
    verbosity = hf_logging.get_verbosity()
    try:
        for model, config in pairs:
            model.generation_config = config if config is not None else copy.deepcopy(model.generation_config)
        hf_logging.set_verbosity_error()
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        for (model, _), config in zip(pairs, saved, strict=True):
            model.generation_config = config


def generate(
    target_model: Any,
    input_ids: torch.Tensor,
    settings: SamplingSettings,
    max_new_tokens: int,
    *,
    eos_token_ids: Collection[int] | None,
    seed: int,
    draft_model: Any | None = None,
    assistant_gamma: int | None = None,
    tokenizer: Any | None = None,
    streamer: Any | None = None,
) -> torch.Tensor:
    """One `target_model.generate` call: plain, or assisted by `draft_model`.

    Args:
        input_ids: [B, L] prompts of equal length (no padding). Assisted generation takes B = 1.
        eos_token_ids: the ids that end a row, or None to always run to max_new_tokens.
        seed: the global torch seed for the call (transformers samples from the global generator);
            the caller's global random state is restored afterwards.
        assistant_gamma: draft tokens per round, or None for transformers' own policy (module docstring).
        tokenizer: needed only when the two models' vocabulary sizes differ: transformers then runs
            "universal" assisted generation, which re-tokenizes between the models.
        streamer: passed through (gets the prompt, then each round's new tokens).

    Returns:
        [B, L + generated] token ids (rows that ended early are padded with the pad id).
    """
    from transformers import GenerationConfig

    kwargs: dict[str, Any] = {"streamer": streamer}
    isolated: list[tuple[Any, Any]] = [(target_model, GenerationConfig())]
    if draft_model is not None:
        if input_ids.shape[0] != 1:
            raise ValueError(f"assisted generation takes one prompt at a time, got {input_ids.shape[0]}")
        kwargs["assistant_model"] = draft_model
        isolated.append((draft_model, None if assistant_gamma is None else assistant_config(assistant_gamma)))
        if uses_universal_assistant(target_model, draft_model):
            if tokenizer is None:
                raise ValueError(
                    "HF assisted generation needs the tokenizer when the vocabulary sizes differ"
                )
            kwargs.update(tokenizer=tokenizer, assistant_tokenizer=tokenizer)
    with (
        isolated_generation_configs(*isolated),
        torch.random.fork_rng(devices=[]),
        torch.inference_mode(),
    ):
        # Built inside the silenced block: transformers warns about fields that greedy decoding ignores.
        config = generation_config(
            settings, max_new_tokens, eos_token_ids, pad_token_id(target_model, eos_token_ids or ())
        )
        torch.manual_seed(seed)
        return target_model.generate(
            input_ids, attention_mask=torch.ones_like(input_ids), generation_config=config, **kwargs
        )


def uses_universal_assistant(target_model: Any, draft_model: Any) -> bool:
    """Whether transformers treats the pair as different tokenizers (different vocabulary sizes)."""
    return config_vocab(target_model) != config_vocab(draft_model)
