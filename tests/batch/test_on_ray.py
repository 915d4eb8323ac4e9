"""`exactspec batch --ray` on a local Ray instance (2 CPUs, started once per test session): the same
bytes as a local run for 1 and 2 workers (the draft model at a fixed gamma, `jobs.batch_args`), and for a
Ray run whose driver is killed (kill -9) midway and then resumed; with the defaults (suffix drafter,
planned gamma, each worker planning from the costs it measured) every record's entry but its statistics."""

from __future__ import annotations

from pathlib import Path

import pytest
from jobs import (
    batch_args,
    entries_by_id_without_statistics,
    job_records,
    local_reference,
    run_killed,
    write_jsonl,
)

from exactspec.cli import EXIT_OK
from exactspec.cli.main import main


@pytest.fixture(scope="module")
def reference(tiny_model_folders: tuple[str, str], tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return local_reference(tiny_model_folders, tmp_path_factory.mktemp("reference")).read_bytes()


@pytest.mark.parametrize("workers", [1, 2])
def test_ray_workers_write_the_bytes_of_a_local_run(
    ray_address: str, tiny_model_folders: tuple[str, str], reference: bytes, tmp_path: Path, workers: int
) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", job_records())
    out = tmp_path / "out.jsonl"
    ray = ["--ray", "--workers", str(workers), "--cpus-per-worker", "1", "--block-size", "4"]
    assert main(batch_args(tiny_model_folders, source, out, *ray)) == EXIT_OK
    assert out.read_bytes() == reference


def test_ray_workers_with_the_defaults_give_every_record_the_entry_of_a_local_run(
    ray_address: str, tiny_model_folders: tuple[str, str], tmp_path: Path
) -> None:
    """Suffix drafts and planned gamma: 2 workers, each with its own costs, tree and batches, write every
    record's entry but its statistics as one local process does (docs/batch.md, Seeds)."""
    (tmp_path / "local").mkdir()
    local = local_reference(tiny_model_folders, tmp_path / "local", defaults=True)
    source = write_jsonl(tmp_path / "in.jsonl", job_records())
    out = tmp_path / "ray.jsonl"
    ray = ["--ray", "--workers", "2", "--cpus-per-worker", "1", "--block-size", "4"]
    assert main(batch_args(tiny_model_folders, source, out, *ray, defaults=True)) == EXIT_OK
    assert entries_by_id_without_statistics(out) == entries_by_id_without_statistics(local)


def test_a_ray_run_killed_midway_resumes_to_the_same_file(
    ray_address: str,
    tiny_model_folders: tuple[str, str],
    reference: bytes,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", job_records())
    out = tmp_path / "out.jsonl"
    ray = [f"--ray={ray_address}", "--workers", "2", "--cpus-per-worker", "1", "--block-size", "4"]
    run_killed(batch_args(tiny_model_folders, source, out, *ray))  # the driver, in its own process
    left = out.read_bytes()
    whole = left[: left.rfind(b"\n") + 1]
    assert left != whole and reference.startswith(whole) and 0 < whole.count(b"\n") < len(job_records())
    assert main(batch_args(tiny_model_folders, source, out)) == EXIT_OK  # resumed here, locally
    assert "cut a partial last line" in capsys.readouterr().err
    assert out.read_bytes() == reference


class FakeRay:
    def __init__(self, cpus: list[int]) -> None:
        self.cpus = cpus

    def nodes(self) -> list[dict]:
        return [{"Alive": True, "Resources": {"CPU": float(c)}} for c in self.cpus] + [{"Alive": False}]


@pytest.mark.parametrize(
    ("cpus", "workers", "each"),
    [([2], 1, 2), ([2], 2, 1), ([2], 3, 1), ([16, 16, 16, 16], 4, 16), ([16, 8], 4, 4), ([16], 32, 1)],
)
def test_default_cpus_per_worker_is_an_even_share_of_the_smallest_node(
    cpus: list[int], workers: int, each: int
) -> None:
    from exactspec.batch.on_ray import default_cpus_per_worker

    assert default_cpus_per_worker(FakeRay(cpus), workers) == each


@pytest.mark.slow  # about two minutes on 2 cores: Ray workers each export the model and measure its costs
def test_the_batch_invariant_mode_gives_the_tokens_of_a_local_run_on_ray_workers(
    ray_address: str, tmp_path: Path
) -> None:
    """ONNX Runtime in the batch-invariant mode, the default suffix drafter with planned gamma: 2 Ray
    workers (each measuring its own pass costs, each with its own suffix tree) write every record's tokens
    as one local process does, because no record's tokens depend on what was computed beside it."""
    pytest.importorskip("onnxruntime_genai")
    import json

    from conftest import (
        TOKENIZER_EOS_ID,
        TOKENIZER_VOCAB,
        skip_unless_kernels_are_invariant,
        tiny_causal_lm,
        tiny_tokenizer,
    )

    folder = tmp_path / "target"
    model = tiny_causal_lm(
        vocab_size=len(TOKENIZER_VOCAB),
        seed=3,
        initializer_range=0.2,
        eos_token_id=TOKENIZER_EOS_ID,
        tie_word_embeddings=False,
        hidden_size=64,
        intermediate_size=128,  # head size 16: ONNX attention
    )
    model.save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    from exactspec.models.onnx.export import INVARIANT_RECIPE, exported_model

    skip_unless_kernels_are_invariant(exported_model(folder, INVARIANT_RECIPE, cache_dir=tmp_path / "cache"))
    records = [
        {
            "id": i,
            "prompt": f"def add(a, b): {i % 3} " * (1 + i % 4),
            "max_tokens": 12 + i,
            "seed": i,
            "temperature": 0.0 if i % 3 == 0 else 0.8,
        }
        for i in range(10)
    ]
    source = write_jsonl(tmp_path / "in.jsonl", records)
    common = ["--target", str(folder), "--backend", "onnx", "--batch-invariant", "--max-batch", "3"]
    common += ["--no-progress", "--cache-dir", str(tmp_path / "cache")]
    outputs = {}
    for name, extra in (
        ("local", []),
        ("ray", ["--ray", "--workers", "2", "--cpus-per-worker", "1", "--block-size", "4"]),
    ):
        out = tmp_path / f"{name}.jsonl"
        assert main(["batch", str(source), "--out", str(out), *common, *extra]) == EXIT_OK
        outputs[name] = {
            e["id"]: (e.get("text"), e.get("error")) for e in map(json.loads, out.read_text().splitlines())
        }
    assert outputs["local"] == outputs["ray"]
    assert all(error is None for _, error in outputs["local"].values())
