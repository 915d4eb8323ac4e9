"""Every default a user meets, in one place: the Python API, every command and the server read them here.

A value a request or a flag does not give comes from `DEFAULTS`; `--help`, the README and
docs/python-api.md print these values (tests/cli/test_help_defaults.py checks that what `--help`
prints is what is parsed). Where two entry points differ on purpose, both values stand here beside
the reason.

>>> DEFAULTS.temperature, DEFAULTS.generate_temperature
(1.0, 0.0)
>>> DEFAULTS.fixed_gamma("int4"), DEFAULTS.fixed_gamma("bf16"), DEFAULTS.adaptive_gamma_cap
(2, 4, 4)
>>> DEFAULTS.drafter, DEFAULTS.free_drafter, DEFAULTS.drafter_for(draft_loaded=False)
('hybrid', 'suffix', 'suffix')
>>> [DEFAULTS.loads_draft(t, d) for t, d in [("default-target", "default-draft"), ("my/m", "default-draft")]]
[True, False]
>>> DEFAULTS.gamma("gguf", adaptive=True, free=True)
8
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Defaults:
    """The defaults of every entry point (see the module docstring).

    Sampling:
        temperature: 1.0 for the Python API, the server and batch jobs: sampling from the model's
            own law, as OpenAI's API, vLLM and transformers' sampling do when none is given.
        generate_temperature: 0.0 (greedy) for `exactspec generate` only: a command line run to read
            one answer, as transformers' `generate` and llama.cpp's examples default to greedy; pass
            `--temperature` to sample.
        max_tokens: the length limit of a request that names none (cut to what the context leaves), and
            of the engine's own `DecodeConfig`.
        seed: the seed of the Python API and of every command that samples (`generate`, `batch`,
            `verify`, `bench`, `audit`): reproducible by default; a server request without a seed gets a
            fresh random stream, as OpenAI's API does.
    Speculation:
        drafter: "hybrid" (`drafters.hybrid`), where a draft model is loaded (the built-in pair's, or one
            --draft names): a row whose history has a match drafts the suffix drafter's free chain (the
            prompt, the output so far, earlier requests' outputs), a row without one the draft model's
            tokens, and the planner picks per row and round the source it predicts more tokens per second
            from, or a plain round. Under token verification both kinds of draft keep plain decoding's
            seeded tokens (coupled, docs/algorithm.md 5), so the default's output is plain decoding's
            token for token. Measured on the built-in pair (docs/bench/default-hybrid): the hybrid's
            median over the coding and grounded prompts is above the suffix drafter's alone, which
            finds nothing to copy in text written from scratch.
        free_drafter: "suffix" (`drafters.suffix`), where no draft model is loaded (`--draft none`, a
            target of the user's with no --draft: the built-in draft's vocabulary is Qwen2.5's, a
            `SpeculativeDecoder` built without one): drafts that cost no model pass. `drafter_for`
            picks between the two.
        verifier: token-by-token verification (`decoding.strategy`).
        adaptive_gamma: each round's draft lengths planned from each row's acceptance and the measured
            times of whole rounds (`decoding.round_times`), for the API, `generate`, the server and
            batch jobs alike; a round that no draft is predicted to speed up is plain. A batch job plans
            rows together only where a record's tokens cannot depend on its draft lengths (token
            verification: lookups and coupled model drafts); under block verification each row plans
            alone (`exactspec.batch`: a record's tokens must not depend on its neighbours).
        adaptive_gamma_cap, free_adaptive_gamma_cap: the most draft tokens a planned row may get when no
            gamma is given, with the draft model and with a drafter that runs no model (its drafts are
            free, so only the target's cost of scoring them limits them, and the planner weighs that);
            the hybrid gets the second: its lookup chains are free, its model drafts planned within it.
        int4_gamma, dense_gamma: the fixed draft length when none is given, by the target's weights
            (`fixed_gamma`): torch's int4 CPU kernel scores a block of up to 4 tokens far cheaper than
            one of 5, so gamma 2 had the best worst case over the coding prompts; dense weights: gamma 4,
            the best median of the default pair's quick bench (docs/performance.md, "Packed weights and
            llama.cpp" and "Dense weights: the first quick bench").
        check_gamma: the fixed draft length of the checks that run the draft model (`verify`'s statistical
            mode, `audit`, `numerics`): at least every fixed default above, so that the draft positions
            a default run uses are all checked.
    Models:
        target, draft: the built-in pair (`exactspec.models.loading.DEFAULT_SPECS`). A command loads the
            draft only when its drafter runs a model; `SpeculativeDecoder.from_pretrained` loads it, for
            the later calls that ask for the draft model.
        dtype, weights, device: "auto" each: the device is CUDA when torch sees a GPU, else the CPU
            (`exactspec.models.device`), and dtype and weights are that device's measured best (int4
            weights on the CPU, bf16 on CUDA). The Python API and every command alike.
        backend: "auto": the installed backend predicted fastest for the work at hand (the drafter and its
            draft lengths, plain decoding, the server's batch) from its step and k-token passes measured
            on this machine on first use and cached (`exactspec.models.backends.auto`).
        threads: the intra-op threads of llama.cpp (the backend and the bench's peer) and of the bench's
            onnxruntime-genai peer when `--threads` gives none: the cores of the small CPUs this project
            is measured on, and the same for every side a bench compares.
        max_rows: the rows one llama.cpp context holds at a time (its sequences, n_seq_max).
    Serving and batching:
        max_batch: rows decoded together in one round (each row costs KV cache memory).
        max_waiting: requests that may wait for a free row; beyond that the server answers 429.
        prefill_chunk: prompt tokens prefilled per round for joining requests, so that the running
            rows wait for at most one such chunk's forward per round.
        idle_release_seconds: how long a server runs no round before its models give back the
            memory that grew with its busiest batch (the ONNX backend's KV buffers).
    On Ray (`serve --ray-serve`, `batch --ray`):
        replicas, cpus_per_replica: Ray Serve replicas, each one model pair with its own batching, and
            the CPUs each reserves (also its torch threads).
        ray_workers: Ray Data actors of a batch job, each one model pair.
    """

    temperature: float = 1.0
    generate_temperature: float = 0.0
    max_tokens: int = 256
    seed: int = 0
    drafter: str = "hybrid"
    free_drafter: str = "suffix"
    verifier: str = "token"
    adaptive_gamma: bool = True
    adaptive_gamma_cap: int = 4
    free_adaptive_gamma_cap: int = 8
    int4_gamma: int = 2
    dense_gamma: int = 4
    check_gamma: int = 4
    target: str = "default-target"
    draft: str = "default-draft"
    dtype: str = "auto"
    weights: str = "auto"
    device: str = "auto"
    backend: str = "auto"
    threads: int = 2
    max_rows: int = 16
    max_batch: int = 8
    max_waiting: int = 64
    prefill_chunk: int = 32
    idle_release_seconds: float = 30.0
    replicas: int = 1
    cpus_per_replica: int = 1
    ray_workers: int = 1

    def fixed_gamma(self, weights: str) -> int:
        """The draft length when none is given and gamma is fixed, for a target with these weights."""
        return self.int4_gamma if str(weights).startswith("int4") else self.dense_gamma

    def loads_draft(self, target: object, draft: object) -> bool:
        """Whether a run that names no drafter loads `draft` beside `target` (and so drafts with the hybrid,
        `drafter_for`): a draft the caller named, or the built-in draft beside the built-in target only
        (its vocabulary is Qwen2.5's); never None or "none"."""
        if draft is None or str(draft).lower() == "none":
            return False
        return draft != self.draft or target == self.target

    def drafter_for(self, draft_loaded: bool) -> str:
        """The drafter of a run that names none: the hybrid where a draft model is loaded, else the suffix
        drafter (the class docstring)."""
        return self.drafter if draft_loaded else self.free_drafter

    def gamma(self, weights: str, adaptive: bool, free: bool = False) -> int:
        """The draft length (the cap, when adaptive) when none is given; `free`: the drafter runs no model."""
        if adaptive:
            return self.free_adaptive_gamma_cap if free else self.adaptive_gamma_cap
        return self.fixed_gamma(weights)


DEFAULTS = Defaults()
