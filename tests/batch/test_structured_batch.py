"""Structured output in batch jobs: the job's --json-schema for records without their own, a record's
own `response_format` or `grammar` (the server's shapes), and error entries naming the field."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
from jobs import batch_args, entries, write_jsonl

from exactspec.cli import EXIT_OK
from exactspec.cli.main import main

SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "colour": {"enum": ["red", "green", "blue"]}},
    "required": ["ok", "colour"],
    "additionalProperties": False,
}


def test_batch_records_take_the_jobs_schema_or_their_own_structure(
    tiny_model_folders: tuple[str, str], tmp_path: Path
) -> None:
    schema_file = tmp_path / "schema.json"
    schema_file.write_text(json.dumps(SCHEMA))
    records = [
        {"id": "job-schema", "prompt": "a", "max_tokens": 60, "temperature": 1.0},
        {"id": "grammar", "prompt": "b", "grammar": 'root ::= "yes" | "no"'},
        {"id": "object", "prompt": "c", "max_tokens": 80, "response_format": {"type": "json_object"}},
        {"id": "bad", "prompt": "d", "response_format": {"type": "json_schema", "json_schema": {}}},
        {"id": "bad-schema", "prompt": "d", "grammar": "root ::= nowhere"},
    ]
    out = tmp_path / "out.jsonl"
    source = write_jsonl(tmp_path / "in.jsonl", records)
    assert main(batch_args(tiny_model_folders, source, out, "--json-schema", str(schema_file))) == EXIT_OK
    written = {entry["id"]: entry for entry in entries(out)}
    jsonschema.validate(json.loads(written["job-schema"]["text"]), SCHEMA)
    assert written["grammar"]["text"] in ("yes", "no")
    if written["object"]["finish_reason"] != "length":
        assert isinstance(json.loads(written["object"]["text"]), dict)
    assert written["bad"]["error_param"] == "response_format"
    assert written["bad-schema"]["error_param"] == "grammar" and "nowhere" in written["bad-schema"]["error"]
