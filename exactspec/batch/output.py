"""A batch job's output file: recovered and locked on open, appended whole lines at a time, in input order.

What a `kill -9` can leave and what the next run does with it:

- The JSONL output only ever grows by whole lines: each flush writes the lines of the records
  that became ready with one `write`, then `fsync`s. A kill during a write leaves a trailing
  partial line; `OutputFile.open` cuts everything after the last newline away (it is never parsed
  as a record), so every line in the file is a whole entry.
- Entries are written in input order (`InOrderWriter`: a record that finishes early waits for the
  records before it). So what one run wrote is always a prefix of the pending records in input
  order, a resumed run appends the rest in the same order, and the file is byte for byte the one an
  uninterrupted run writes, whatever the number of workers or the blocks records fell into.
- One writer at a time: the file is locked (`flock`) while a job runs, and a second job on the same
  output stops with a usage error. The lock dies with its process, so a killed job leaves none.

A Parquet output (`.parquet`) cannot grow a row at a time: its entries go to a JSONL journal beside
it (`<name>.journal.jsonl`, the rules above) and `finish` writes the Parquet file (a temporary file
renamed into place) from the rows it had and the journal's, then removes the journal.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from exactspec.batch.records import (
    InputRecord,
    RecordError,
    entry_line,
    error_entry,
    id_key,
    is_error,
    is_parquet,
    parquet_module,
)
from exactspec.foundations.errors import InvalidArgument


class RecordFailed(InvalidArgument):
    """A record failed and the job was asked to stop at the first failure (`--fail-fast`)."""

    def __init__(self, entry: Mapping[str, Any], written: int) -> None:
        super().__init__(
            f"record {entry['id']!r} failed: {entry['error']}; stopped there (--fail-fast): the "
            f"{written} records before it are written. Fix the record and run the same command to resume"
        )
        self.entry = entry


class OutputFile:
    """A JSONL output opened for a job (module docstring): `done` holds the id keys already in it."""

    def __init__(self, path: Path, fd: int, done: dict[str, int], dropped: int) -> None:
        self.path = path
        self._fd = fd
        self.done = done  # id key -> 1-based line
        self.dropped_bytes = dropped  # the partial last line cut away on open
        self.written = 0

    @classmethod
    def open(cls, path: str | Path, flag: str = "--out") -> OutputFile:
        """Create or recover the output and lock it; a usage error naming `flag` if it cannot be used."""
        path = Path(path).expanduser()
        if path.is_dir():
            raise InvalidArgument(f"{flag} {path} is a folder; give a file path (.jsonl or .parquet)")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError as error:
            reason = error.strerror or str(error)
            if isinstance(error, FileExistsError | NotADirectoryError):
                reason = "a file stands where a folder of its path should be"
            message = f"{flag} {path} cannot be written ({reason}); give a writable path"
            raise InvalidArgument(message) from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise InvalidArgument(
                    f"{flag} {path} is being written by another exactspec batch job; wait for it or give "
                    "another path"
                ) from None
            done, dropped = _recover(fd, path, flag)
        except BaseException:
            os.close(fd)
            raise
        return cls(path, fd, done, dropped)

    def append(self, lines: Sequence[bytes]) -> None:
        """Write whole lines and make them durable (one write, one fsync)."""
        if not lines:
            return
        data = memoryview(b"".join(lines))
        while data:
            written = os.write(self._fd, data)
            data = data[written:]
        os.fsync(self._fd)
        self.written += len(lines)

    def finish(self) -> None:
        """Nothing to do: a JSONL output is complete once its lines are written."""

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)  # also releases the lock


def _recover(fd: int, path: Path, flag: str) -> tuple[dict[str, int], int]:
    """Cut a trailing partial line off; the id keys of the whole lines (a usage error for a line that
    is not an entry: this is not a batch output, or it was edited)."""
    size = os.fstat(fd).st_size
    data = os.pread(fd, size, 0) if size else b""
    end = data.rfind(b"\n") + 1  # 0 when there is no newline at all
    dropped = len(data) - end
    if dropped:
        os.ftruncate(fd, end)
        os.fsync(fd)
    done: dict[str, int] = {}
    for number, line in enumerate(data[:end].splitlines(), start=1):
        try:
            entry = json.loads(line)
            key = id_key(entry["id"])
        except (ValueError, KeyError, TypeError):
            raise InvalidArgument(
                f"{flag} {path} line {number} is not an exactspec batch entry; give the output of this "
                "job (it resumes) or a new path"
            ) from None
        done[key] = number
    return done, dropped


class ParquetOutput(OutputFile):
    """A Parquet output: a JSONL journal while the job runs, the Parquet file when it finishes."""

    def __init__(self, target: Path, journal: OutputFile, kept: Any) -> None:
        super().__init__(journal.path, journal._fd, dict(journal.done), journal.dropped_bytes)
        self.target = target
        self._kept = kept  # the rows the Parquet file already had (a pyarrow Table), or None
        if kept is not None:
            for record_id in kept.column("id").to_pylist():
                self.done[id_key(record_id)] = 0

    @classmethod
    def open(cls, path: str | Path, flag: str = "--out") -> ParquetOutput:
        target = Path(path).expanduser()
        pq = parquet_module("write a Parquet output")
        journal = OutputFile.open(target.with_name(target.name + ".journal.jsonl"), flag)
        kept = None
        if target.exists():
            try:
                kept = pq.read_table(target)
            except Exception as error:
                journal.close()
                raise InvalidArgument(f"{flag} {target} exists and is not a Parquet file ({error})") from None
        return cls(target, journal, kept)

    def finish(self) -> None:
        """Write the Parquet file (the rows it had, then the journal's in order), then drop the journal."""
        import pyarrow as pa

        pq = parquet_module("write a Parquet output")
        size = os.fstat(self._fd).st_size
        entries = [json.loads(line) for line in os.pread(self._fd, size, 0).splitlines()] if size else []
        kept_ids = set() if self._kept is None else {id_key(i) for i in self._kept.column("id").to_pylist()}
        # Entries already in the Parquet file: a run that renamed it and died before dropping the journal.
        entries = [e for e in entries if id_key(e["id"]) not in kept_ids]
        if not entries and self._kept is not None:
            self._drop_journal()
            return
        schema = parquet_schema(entries, self._kept)
        table = pa.Table.from_pylist([parquet_row(e) for e in entries], schema=schema)
        if self._kept is not None:
            table = pa.concat_tables([self._kept, table])
        temporary = self.target.with_name(f".{self.target.name}.{os.getpid()}.tmp")
        pq.write_table(table, temporary)
        with open(temporary, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(temporary, self.target)
        self._kept = table
        self._drop_journal()

    def _drop_journal(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


def open_output(path: str | Path, flag: str = "--out") -> OutputFile:
    """The output of a job at `path`: Parquet by its `.parquet` suffix, else JSONL."""
    return ParquetOutput.open(path, flag) if is_parquet(path) else OutputFile.open(path, flag)


def check_parquet_ids(records: Sequence[InputRecord]) -> None:
    """A Parquet output has one type of id: a usage error, before anything runs, for a mix."""
    if len({type(r.fields["id"]) for r in records}) > 1:
        raise InvalidArgument(
            "a Parquet output needs ids of one type, and this input mixes integers and strings; "
            "write JSONL (an --out that does not end in .parquet) or give every id as a string"
        )


def parquet_schema(entries: Sequence[Mapping[str, Any]], kept: Any) -> Any:
    """Parquet columns of the output entries; `id` takes the ids' type (an integer or a string)."""
    import pyarrow as pa

    if kept is not None:
        return kept.schema
    ids = {type(e["id"]) for e in entries}  # one type: check_parquet_ids ran before the job
    statistics = pa.struct(
        [
            ("gamma", pa.int64()),
            ("gamma_planned", pa.bool_()),
            ("rounds", pa.int64()),
            ("proposed_tokens", pa.int64()),
            ("accepted_tokens", pa.int64()),
            ("acceptance_rate", pa.float64()),
            ("tokens_per_round", pa.float64()),
        ]
    )
    settings = pa.struct(
        [
            ("temperature", pa.float64()),
            ("top_k", pa.int64()),
            ("top_p", pa.float64()),
            ("min_p", pa.float64()),
            ("repetition_penalty", pa.float64()),
            ("presence_penalty", pa.float64()),
            ("frequency_penalty", pa.float64()),
            ("logit_bias", pa.map_(pa.int64(), pa.float64())),
            ("max_tokens", pa.int64()),
            ("seed", pa.int64()),
            ("stop", pa.list_(pa.string())),
            ("gamma", pa.int64()),
            ("chat", pa.bool_()),
        ]
    )
    return pa.schema(
        [
            ("id", pa.int64() if ids == {int} else pa.string()),
            ("text", pa.string()),
            ("token_ids", pa.list_(pa.int64())),
            ("finish_reason", pa.string()),
            ("prompt_tokens", pa.int64()),
            ("completion_tokens", pa.int64()),
            ("statistics", statistics),
            ("settings", settings),
            ("error", pa.string()),
            ("error_param", pa.string()),
            ("error_code", pa.string()),
        ]
    )


def parquet_row(entry: Mapping[str, Any]) -> dict[str, Any]:
    """An entry as a Parquet row: logit-bias keys back to token ids (JSON keys are text)."""
    row = dict(entry)
    if row.get("settings") is not None:
        settings = dict(row["settings"])
        settings["logit_bias"] = {int(k): v for k, v in settings["logit_bias"].items()}
        row["settings"] = settings
    return row


class InOrderWriter:
    """Writes entries in input order: position i is written once positions 0..i-1 are (module docstring).

    `add` takes an entry at its position among the job's pending records (0, 1, 2, ...); `flush`
    writes the ready prefix with one append. With `fail_fast`, a failed record at the head stops the
    job (`RecordFailed`) after the entries before it are written; it is not written, so that a
    resumed run tries it again.
    """

    def __init__(
        self,
        output: OutputFile,
        *,
        fail_fast: bool = False,
        on_write: Callable[[Mapping[str, Any]], None] | None = None,
    ) -> None:
        self.output = output
        self.fail_fast = fail_fast
        self.on_write = on_write
        self.next = 0  # the position written next
        self._ready: dict[int, Mapping[str, Any]] = {}

    @property
    def waiting(self) -> int:
        """Entries that finished but wait for an earlier record."""
        return len(self._ready)

    def add(self, position: int, entry: Mapping[str, Any]) -> None:
        if position < self.next or position in self._ready:
            raise ValueError(f"position {position} was given twice")
        self._ready[position] = entry

    def add_error(self, position: int, error: RecordError) -> None:
        self.add(position, error_entry(error))

    def flush(self) -> None:
        lines: list[bytes] = []
        written: list[Mapping[str, Any]] = []
        failed = None
        while self.next in self._ready:
            entry = self._ready[self.next]
            if self.fail_fast and is_error(entry):
                failed = entry
                break
            lines.append(entry_line(entry))
            written.append(entry)
            del self._ready[self.next]
            self.next += 1
        self.output.append(lines)
        if self.on_write is not None:
            for entry in written:
                self.on_write(entry)
        if failed is not None:
            raise RecordFailed(failed, self.output.written)
