"""`exactspec batch` on one machine: entries for every record, seeds of their own, resume after a kill -9
(byte for byte), error entries, --fail-fast, and no model loaded when the flags, input or output are bad.

Tiny float32 models in folders (`tiny_model_folders`): their passes are batch-invariant on the CPU, so
a record's tokens do not depend on the rows it shares rounds with. The draft model's jobs draft a fixed
gamma (`jobs.batch_args`), so whole output files compare byte for byte; the default drafter's jobs plan
their gamma from the costs each process measures, and every entry but its statistics compares.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from jobs import (
    batch_args,
    entries,
    entries_by_id_without_statistics,
    job_records,
    local_reference,
    run_killed,
    write_jsonl,
)

from exactspec.batch.output import InOrderWriter, OutputFile
from exactspec.batch.records import record_seed
from exactspec.cli import EXIT_OK, EXIT_USAGE
from exactspec.cli.main import main
from exactspec.foundations.errors import InvalidArgument
from exactspec.models.pair import ModelPair


@pytest.fixture(scope="module")
def reference(tiny_model_folders: tuple[str, str], tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return local_reference(tiny_model_folders, tmp_path_factory.mktemp("reference")).read_bytes()


def test_every_record_gets_an_entry_in_input_order(reference: bytes) -> None:
    written = [json.loads(line) for line in reference.decode().splitlines()]
    assert [e["id"] for e in written] == [r["id"] for r in job_records()]
    results = {e["id"]: e for e in written if e.get("error") is None}
    errors = {e["id"]: e for e in written if e.get("error") is not None}
    assert set(errors) == {"too-long", "bad-temperature", "bad-presence", "bias-outside-vocab", "no-prompt"}
    assert errors["too-long"]["error_code"] == "context_length_exceeded"
    assert errors["bad-temperature"]["error_param"] == "temperature"
    assert errors["bad-presence"]["error_param"] == "presence_penalty"
    assert errors["bias-outside-vocab"]["error_param"] == "logit_bias"
    assert all("text" not in e for e in errors.values())
    for record in job_records():
        if record["id"] not in results:
            continue
        entry = results[record["id"]]
        assert 1 <= entry["completion_tokens"] == len(entry["token_ids"]) <= entry["settings"]["max_tokens"]
        assert entry["finish_reason"] in ("eos", "stop", "length")
        assert entry["settings"]["max_tokens"] == record.get("max_tokens", entry["settings"]["max_tokens"])
        statistics = entry["statistics"]
        assert statistics["rounds"] >= 1 and statistics["accepted_tokens"] <= statistics["proposed_tokens"]
    assert results["r1"]["settings"]["seed"] == 12345
    assert results["r0"]["settings"]["seed"] == record_seed(0, "r0")
    assert results["r2"]["settings"]["temperature"] == 0.0 and results["r0"]["settings"]["temperature"] == 1.0
    assert results["r3"]["settings"]["chat"] is True
    assert results["r8"]["settings"]["presence_penalty"] == -2.0
    assert results["r8"]["settings"]["frequency_penalty"] == 1.5
    assert results["r5"]["statistics"]["proposed_tokens"] == 0 and results["r5"]["settings"]["gamma"] == 0
    assert results["r6"]["settings"]["logit_bias"] == {"40": -100.0} and 40 not in results["r6"]["token_ids"]
    # The draft model at the fixed gamma 4 the job pins (`jobs.batch_args`).
    assert results["r0"]["settings"]["gamma"] == 4 and not results["r0"]["statistics"]["gamma_planned"]
    stopped, unstopped = results["r4"], results["r2"]  # the same prompt, greedy; r4 stops at "R8"
    assert "R8" in unstopped["text"] and stopped["finish_reason"] == "stop"
    assert stopped["text"] == unstopped["text"][: unstopped["text"].index("R8")]


def test_derived_seeds_are_a_stable_hash_of_the_job_seed_and_the_id() -> None:
    # Fixed values: Python's salted str hash, or any change of the rule, would move them (and with them
    # every derived-seed output written so far).
    assert record_seed(0, "r0") == 635077296925644493
    assert record_seed(0, 7) == 7265518297475444511
    assert record_seed(5, "q17") == 5963710624360474156
    assert record_seed(1, "r0") != record_seed(0, "r0") != record_seed(0, "r1")
    assert record_seed(0, 7) != record_seed(0, "7")


def test_outputs_do_not_depend_on_order_batch_size_or_a_resume(
    tiny_model_folders: tuple[str, str], reference: bytes, tmp_path: Path
) -> None:
    records = job_records()
    # Input order reversed, one row per round: the same entry for every id.
    reversed_out = tmp_path / "reversed.jsonl"
    source = write_jsonl(tmp_path / "reversed-in.jsonl", records[::-1])
    assert main(batch_args(tiny_model_folders, source, reversed_out, "--max-batch", "1")) == EXIT_OK
    by_id = {e["id"]: e for e in entries(reversed_out)}
    assert [by_id[r["id"]] for r in records] == [json.loads(line) for line in reference.decode().splitlines()]
    # A run over the first five records, then the whole input: the same file as one run.
    out = tmp_path / "resumed.jsonl"
    head = write_jsonl(tmp_path / "head.jsonl", records[:5])
    whole = write_jsonl(tmp_path / "all.jsonl", records)
    assert main(batch_args(tiny_model_folders, head, out)) == EXIT_OK
    assert main(batch_args(tiny_model_folders, whole, out)) == EXIT_OK
    assert out.read_bytes() == reference


@pytest.mark.parametrize("draft_model", [False, True], ids=["suffix", "hybrid"])
def test_planned_default_drafts_leave_every_record_its_tokens_whatever_the_order_batch_or_resume(
    tiny_model_folders: tuple[str, str], tmp_path: Path, draft_model: bool
) -> None:
    """The defaults (the suffix drafter without a draft model, the hybrid with one; planned gamma): rows
    plan together from the costs this process measured and the round times it meets, and the shared tree
    learns in input order, so the draft lengths (and the statistics that count them) depend on timing and
    on the neighbours; the drafts' q is a point mass or coupled to the target's draws (the hybrid's model
    rows), and every position's draw is keyed by the record's seed and the position, so every record's
    entry but its statistics is the same in input order with 3 rows a round, reversed with 1 row a round,
    resumed after 5 records, and at a fixed gamma 8, where drafts are proposed whatever the timing
    (docs/batch.md, Seeds)."""
    records = job_records()
    (tmp_path / "reference").mkdir()
    reference = local_reference(
        tiny_model_folders, tmp_path / "reference", defaults=True, draft_model=draft_model
    )
    forward = entries_by_id_without_statistics(reference)
    assert entries(reference)[0]["statistics"]["gamma_planned"] and forward["r0"]["settings"]["gamma"] == 8
    others = {}
    for name, ordered, extra in (
        ("reversed", records[::-1], ("--max-batch", "1")),
        ("fixed", records, ("--fixed-gamma", "--gamma", "8")),
    ):
        others[name] = tmp_path / f"{name}.jsonl"
        source = write_jsonl(tmp_path / f"{name}-in.jsonl", ordered)
        args = batch_args(
            tiny_model_folders, source, others[name], *extra, defaults=True, draft_model=draft_model
        )
        assert main(args) == EXIT_OK
    others["resumed"] = tmp_path / "resumed.jsonl"
    for part in (records[:5], records):
        source = write_jsonl(tmp_path / f"part-{len(part)}.jsonl", part)
        args = batch_args(
            tiny_model_folders, source, others["resumed"], defaults=True, draft_model=draft_model
        )
        assert main(args) == EXIT_OK
    for name, out in others.items():
        assert entries_by_id_without_statistics(out) == forward, name
    fixed = [e["statistics"] for e in entries(others["fixed"]) if "statistics" in e]
    assert sum(s["proposed_tokens"] for s in fixed) > 0 and not fixed[0]["gamma_planned"]
    assert [e["id"] for e in entries(others["resumed"])] == [r["id"] for r in records]


def test_a_resumed_run_says_what_it_skipped_and_loads_nothing_when_all_is_done(
    tiny_model_folders: tuple[str, str],
    reference: bytes,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    out = tmp_path / "out.jsonl"
    out.write_bytes(reference)
    monkeypatch.setattr(ModelPair, "from_pretrained", _no_model)
    source = write_jsonl(tmp_path / "in.jsonl", job_records())
    assert main(batch_args(tiny_model_folders, source, out)) == EXIT_OK
    assert f"{len(job_records())} already complete" in capsys.readouterr().err
    assert out.read_bytes() == reference


def test_a_run_killed_midway_resumes_to_the_same_file(
    tiny_model_folders: tuple[str, str], reference: bytes, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", job_records())
    out = tmp_path / "out.jsonl"
    run_killed(batch_args(tiny_model_folders, source, out))
    left = out.read_bytes()
    assert left and not left.endswith(b"\n")  # whole entries, then half of one
    whole = left[: left.rfind(b"\n") + 1]
    assert reference.startswith(whole) and 0 < whole.count(b"\n") < len(job_records())
    assert main(batch_args(tiny_model_folders, source, out)) == EXIT_OK
    assert "cut a partial last line" in capsys.readouterr().err
    assert out.read_bytes() == reference


def _no_model(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("a model was loaded")


@pytest.mark.parametrize("where", ["folder", "under-a-file"])
def test_an_unwritable_out_is_a_usage_error_before_any_model_loads(
    tiny_model_folders: tuple[str, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    where: str,
) -> None:
    monkeypatch.setattr(ModelPair, "from_pretrained", _no_model)
    (tmp_path / "file").write_text("x")
    out = tmp_path if where == "folder" else tmp_path / "file" / "out.jsonl"
    source = write_jsonl(tmp_path / "in.jsonl", job_records())
    assert main(batch_args(tiny_model_folders, source, out)) == EXIT_USAGE
    assert "--out" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("records", "message"),
    [
        ([{"prompt": "a"}], "has no id"),
        ([{"id": 1, "prompt": "a"}, {"id": 1, "prompt": "b"}], "repeats id 1"),
        ([{"id": None, "prompt": "a"}], "has no id"),
        ([{"id": 1.5, "prompt": "a"}], "id must be"),
    ],
)
def test_records_without_a_unique_id_are_usage_errors_before_any_model_loads(
    tiny_model_folders: tuple[str, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    records: list[dict[str, Any]],
    message: str,
) -> None:
    monkeypatch.setattr(ModelPair, "from_pretrained", _no_model)
    source = write_jsonl(tmp_path / "in.jsonl", records)
    assert main(batch_args(tiny_model_folders, source, tmp_path / "out.jsonl")) == EXIT_USAGE
    assert message in capsys.readouterr().err


def test_a_line_that_is_not_json_is_a_usage_error(
    tiny_model_folders: tuple[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text('{"id": 1, "prompt": "a"}\n{"id": 2, "prompt": \n')
    assert main(batch_args(tiny_model_folders, source, tmp_path / "out.jsonl")) == EXIT_USAGE
    assert "line 2 is not a JSON object" in capsys.readouterr().err


def test_fail_fast_refuses_a_bad_record_before_any_model_loads(
    tiny_model_folders: tuple[str, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ModelPair, "from_pretrained", _no_model)
    source = write_jsonl(tmp_path / "in.jsonl", job_records())
    assert main(batch_args(tiny_model_folders, source, tmp_path / "out.jsonl", "--fail-fast")) == EXIT_USAGE
    assert "bad-temperature" in capsys.readouterr().err


def test_fail_fast_stops_at_a_record_the_session_refuses_and_a_rerun_goes_on(
    tiny_model_folders: tuple[str, str], reference: bytes, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    records = [r for r in job_records() if r["id"] in {"r0", "r1", "r2", "too-long", "r4"}]
    records.append(records.pop(3))  # r0, r1, r2, too-long, r4
    source = write_jsonl(tmp_path / "in.jsonl", records)
    out = tmp_path / "out.jsonl"
    assert main(batch_args(tiny_model_folders, source, out, "--fail-fast")) == EXIT_USAGE
    assert "'too-long' failed" in capsys.readouterr().err
    assert [e["id"] for e in entries(out)] == ["r0", "r1", "r2"]  # the records before it, not it
    assert main(batch_args(tiny_model_folders, source, out)) == EXIT_OK
    assert [e["id"] for e in entries(out)] == ["r0", "r1", "r2", "too-long", "r4"]
    expected = {e["id"]: e for e in (json.loads(line) for line in reference.decode().splitlines())}
    assert entries(out) == [expected[r["id"]] for r in records]


def test_a_second_job_on_the_same_output_is_refused(tmp_path: Path) -> None:
    first = OutputFile.open(tmp_path / "out.jsonl")
    try:
        with pytest.raises(InvalidArgument, match="another exactspec batch job"):
            OutputFile.open(tmp_path / "out.jsonl")
    finally:
        first.close()
    OutputFile.open(tmp_path / "out.jsonl").close()  # the lock went with the first job


def test_the_writer_holds_entries_back_until_the_records_before_them_are_written(tmp_path: Path) -> None:
    output = OutputFile.open(tmp_path / "out.jsonl")
    writer = InOrderWriter(output)
    writer.add(1, {"id": "b"})
    writer.add(2, {"id": "c"})
    writer.flush()
    assert (tmp_path / "out.jsonl").read_bytes() == b"" and writer.waiting == 2
    writer.add(0, {"id": "a"})
    writer.flush()
    assert [e["id"] for e in entries(tmp_path / "out.jsonl")] == ["a", "b", "c"]
    with pytest.raises(ValueError, match="twice"):
        writer.add(1, {"id": "b"})
    output.close()


def test_an_output_line_that_is_not_an_entry_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "out.jsonl").write_text('{"id": 1}\nnot json\n')
    with pytest.raises(InvalidArgument, match="line 2 is not an exactspec batch entry"):
        OutputFile.open(tmp_path / "out.jsonl")


def test_parquet_in_and_out_hold_the_same_entries(
    tiny_model_folders: tuple[str, str], reference: bytes, tmp_path: Path
) -> None:
    pa = pytest.importorskip("pyarrow", reason="Parquet needs pyarrow (the ray extra installs it)")
    import pyarrow.parquet as pq

    records = [r for r in job_records() if isinstance(r["id"], str) and r["id"] != "no-prompt"]
    for record in records:
        if "logit_bias" in record:
            record["logit_bias"] = {int(k): v for k, v in record["logit_bias"].items()}
    message = pa.struct([("role", pa.string()), ("content", pa.string())])
    schema = pa.schema(  # a column per field, null where a record gives none
        [
            ("id", pa.string()),
            ("prompt", pa.string()),
            ("messages", pa.list_(message)),
            ("max_tokens", pa.int64()),
            ("seed", pa.int64()),
            ("temperature", pa.float64()),
            ("top_k", pa.int64()),
            ("top_p", pa.float64()),
            ("presence_penalty", pa.float64()),
            ("frequency_penalty", pa.float64()),
            ("logit_bias", pa.map_(pa.int64(), pa.float64())),
            ("stop", pa.list_(pa.string())),
            ("gamma", pa.int64()),
        ]
    )
    source = tmp_path / "in.parquet"
    pq.write_table(pa.Table.from_pylist(records, schema=schema), source)
    out = tmp_path / "out.parquet"
    assert main(batch_args(tiny_model_folders, source, out)) == EXIT_OK
    assert not (tmp_path / "out.parquet.journal.jsonl").exists()
    rows = pq.read_table(out).to_pylist()
    expected = {e["id"]: e for e in (json.loads(line) for line in reference.decode().splitlines())}
    assert [row["id"] for row in rows] == [r["id"] for r in records]
    for row in rows:
        entry = expected[row["id"]]
        if entry.get("error") is not None:
            assert row["error_param"] == entry["error_param"] and row["text"] is None
            continue
        assert (row["text"], row["token_ids"]) == (entry["text"], entry["token_ids"])
        assert row["statistics"] == entry["statistics"]
        settings = dict(row["settings"], logit_bias={str(k): v for k, v in row["settings"]["logit_bias"]})
        assert settings == entry["settings"]
