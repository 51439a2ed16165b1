"""Checking a store end to end: its commit record, its metadata and every committed chunk.

:func:`verify` reads everything a load could need and reports, per column (by tree path) and
per chunk, what is missing or damaged. Chunks written by pytreestore carry a zarr v3
``crc32c`` checksum, so flipped bits are found even in uncompressed columns; every chunk is
stored (all-zero ones too), so a missing chunk below the committed count is lost data.

Example:
    >>> import pytreestore
    >>> store = pytreestore.create("memory://doc-verify", {"x": 0.0}, chunk_records=2)
    >>> store.extend({"x": float(i)} for i in range(5)); store.flush()
    >>> report = store.verify()
    >>> report.ok, report.records, report.chunks
    (True, 5, 3)
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import math
from collections.abc import Sequence
from typing import Any

from pytreestore._format import compression as _compression
from pytreestore._format.keys import ROOT_KEY, chunk_key, chunk_prefix
from pytreestore._format.schema import ColumnSpec, TreeSchema
from pytreestore._inspect import progress as _progress
from pytreestore._log.commit_record import COMMIT_KEY, Commit
from pytreestore._log.prune import front_rows
from pytreestore._read.reader import ReadContext
from pytreestore._runtime import RUNTIME
from pytreestore.backends import CheckedReads, KeyListing
from pytreestore.errors import CorruptStoreError, PyTreeStoreError


@dataclasses.dataclass(frozen=True)
class Problem:
    """One thing :func:`verify` found wrong.

    Attributes:
        path: the column's tree path (``keystr``; ``""`` is the root leaf), or None for a
            problem of the whole store (its commit record or root metadata).
        key: the storage key of the damaged or missing object, below the store root.
        chunk: the chunk's grid index, record axis first, or None for metadata.
        message: what is wrong.
    """

    path: str | None
    key: str
    chunk: tuple[int, ...] | None
    message: str

    def __str__(self) -> str:
        where = "store" if self.path is None else f"column {self.path or 'the root'}"
        chunk = "" if self.chunk is None else f" chunk {self.chunk}"
        return f"{where}{chunk} [{self.key}]: {self.message}"


@dataclasses.dataclass(frozen=True)
class VerifyReport:
    """What :func:`verify` checked and found.

    Attributes:
        location: the store's path or URL.
        records: the committed records checked.
        columns: the columns checked.
        chunks: the chunks read and decoded.
        problems: everything found wrong, in column order.
        unchecksummed: paths of columns whose chunks carry no checksum (a flipped bit in an
            uncompressed chunk of these cannot be detected).
        past_commit: storage keys of chunks stored past the committed records (left by a
            writer that crashed before committing). They hold no committed record and are not
            problems: the next ``open(mode="a")`` deletes them, so that a damaged one cannot
            block appends.
        kept: storage keys of chunks past the committed records that a ``truncate`` left
            for the versions before it (``open(version=...)`` reads them). Not problems:
            ``open(mode="a")`` keeps them; the first append after the truncate gives them up,
            and :meth:`~pytreestore.TreeStore.vacuum` removes those no kept version needs.
    """

    location: str
    records: int
    columns: int
    chunks: int
    problems: tuple[Problem, ...]
    unchecksummed: tuple[str, ...] = ()
    past_commit: tuple[str, ...] = ()
    kept: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """Whether nothing is wrong."""
        return not self.problems

    def __str__(self) -> str:
        head = (
            f"{self.location}: {self.records} records, {self.columns} columns, "
            f"{self.chunks} chunks checked: "
            + ("ok" if self.ok else f"{len(self.problems)} problem(s)")
        )
        lines = [head, *(f"  {p}" for p in self.problems)]
        if self.unchecksummed:
            lines.append(f"  no checksums in: {', '.join(self.unchecksummed)}")
        if self.past_commit:
            lines.append(
                f"  {len(self.past_commit)} chunk(s) past the commit, removed by the next "
                "open(mode='a'): " + ", ".join(self.past_commit[:5])
            )
        if self.kept:
            lines.append(
                f"  {len(self.kept)} chunk(s) past the commit kept for the versions before a "
                "truncate (vacuum() removes those no kept version needs): "
                + ", ".join(self.kept[:5])
            )
        return "\n".join(lines)


def verify_store(
    context: ReadContext, schema: TreeSchema, records: int, *, progress: bool = False
) -> VerifyReport:
    """Verifies a store through its read context: :func:`verify` of the backend it lends.

    A store replaced since it opened raises ``StoreReplacedError``; a damaged commit record
    does not raise here, :func:`verify` reports it.

    Args:
        context: the store's reading context.
        schema: the schema snapshot to check the columns of.
        records: the committed count to check up to, if the commit record is unreadable.
        progress: show a bar of the chunks checked (and MB/s decoded) on standard error.
    """
    with context.reading() as backend:
        with contextlib.suppress(CorruptStoreError):  # a damaged commit record is reported
            context.check_not_replaced(always=True)
        return verify(backend, schema, records, context.path, progress=progress)


def verify(
    backend: Any,
    schema: TreeSchema,
    records: int,
    location: str,
    progress: bool = False,
) -> VerifyReport:
    """Checks the commit record, each column's metadata and every committed chunk.

    Args:
        backend: the store's backend.
        schema: the store's schema.
        records: the committed count to check up to, if the commit record is unreadable.
        location: the store's path, for the report.
        progress: show a bar of the chunks checked (and MB/s decoded) on standard error.

    Raises:
        StorageError: storage could not be reached; nothing can be concluded.
    """
    problems: list[Problem] = []
    commit = _check_commit(backend, records, location, problems)
    _check_root(backend, problems)
    front = _front(backend, schema, commit, location, problems)
    plain: list[str] = []
    past: list[str] = []
    chunks = 0
    for table in dict.fromkeys(c.table for c in schema.storage_columns):
        rows = commit.rows(table)  # a ragged store's tables each have their own rows
        requests: list[tuple[ColumnSpec, int]] = []
        for column in (c for c in schema.storage_columns if c.table == table):
            # rows released from the front (keep_last) are not read: checked from there
            column = dataclasses.replace(column, start=max(column.start, front[column.key]))
            meta = _check_metadata(backend, column, rows, problems)
            if meta is None:
                continue
            if not _compression.parse(meta.get("codecs"), column.dtype).checksummed:
                plain.append(column.path or "the root")
            _check_present(backend, column, rows, problems, past)
            first = column.start // column.chunks[0]  # chunks wholly before start: unstored
            last = -(-rows // column.chunks[0]) if rows > column.start else first
            requests.extend((column, i) for i in range(first, last))
        problems.extend(_unseen(_read_all(backend, requests, rows, progress), problems))
        chunks += len(requests)
    order = {c.path: i for i, c in enumerate(schema.storage_columns)}
    problems.sort(key=lambda p: (-1 if p.path is None else order[p.path], p.chunk or ()))
    count = len(schema.storage_columns)
    # while a truncate holds rows for older versions, open(mode="a") removes nothing past
    # the commit (:func:`pytreestore._log.protocol.prepare_append`): the versions need them
    past, kept = ([], past) if commit.high is not None else (past, [])
    return VerifyReport(
        location,
        commit.length,
        count,
        chunks,
        tuple(problems),
        tuple(plain),
        tuple(past),
        tuple(kept),
    )


def _read_all(
    backend: Any, requests: list[tuple[ColumnSpec, int]], records: int, progress: bool
) -> list[Problem]:
    """The problems of reading every chunk of ``requests``, with a progress bar."""
    with _progress.progress_bar(
        total=len(requests), desc="verify", record_nbytes=0, enabled=progress, unit=" chunks"
    ) as bar:
        return list(_check_chunks(backend, requests, records, bar))


def _unseen(found: list[Problem], known: list[Problem]) -> list[Problem]:
    """``found`` less the chunks ``known`` already names (a missing chunk also fails to read)."""
    seen = {(p.path, p.chunk) for p in known}
    return [p for p in found if (p.path, p.chunk) not in seen]


def _check_commit(backend: Any, records: int, location: str, problems: list[Problem]) -> Commit:
    try:
        return Commit.from_bytes(backend.read_bytes(COMMIT_KEY), location)
    except CorruptStoreError as err:
        problems.append(Problem(None, COMMIT_KEY, None, str(err)))
        return Commit(records, 0)


def _front(
    backend: Any, schema: TreeSchema, commit: Commit, location: str, problems: list[Problem]
) -> dict[str, int]:
    """Per column, the first row a read of ``commit`` needs (:func:`~pytreestore._log.prune.
    front_rows`); from row 0 where an offsets array it reads for that is damaged (reported)."""
    try:
        return front_rows(backend, schema, commit, location)
    except PyTreeStoreError as err:
        problems.append(Problem(None, COMMIT_KEY, None, f"the front cannot be read: {err}"))
        return {c.key: 0 for c in schema.storage_columns}


def _check_root(backend: Any, problems: list[Problem]) -> None:
    """The root ``zarr.json`` whole: an open parses only its schema, not the consolidated
    metadata after it that zarr readers use."""
    raw = backend.read_bytes(ROOT_KEY)
    try:
        json.loads(raw or b"")
    except ValueError as err:
        problems.append(
            Problem(
                None,
                ROOT_KEY,
                None,
                f"the root zarr.json is not valid JSON ({err}): its consolidated metadata, "
                "which zarr readers use, is damaged; the next writer to open the store "
                "(pytreestore.open(path, 'a')) rewrites it",
            )
        )


def _check_metadata(
    backend: Any, column: ColumnSpec, records: int, problems: list[Problem]
) -> dict[str, Any] | None:
    key = f"{column.key}/zarr.json"

    def fail(message: str) -> None:
        problems.append(Problem(column.path, key, None, message))

    raw = backend.read_bytes(key)
    if raw is None:
        fail("the column's zarr.json is missing")
        return None
    try:
        meta = json.loads(raw)
        shape = [int(n) for n in meta["shape"]]
        chunks = [int(n) for n in meta["chunk_grid"]["configuration"]["chunk_shape"]]
        dtype = str(meta["data_type"])
    except (ValueError, KeyError, TypeError) as err:
        fail(f"the column's zarr.json is damaged: {err!r}")
        return None
    want = (column.dtype.name, list(column.shape), list(column.chunks))
    if (dtype, shape[1:], chunks) != want:
        fail(
            f"zarr.json holds {dtype}{shape[1:]} in chunks {chunks}; the schema says "
            f"{want[0]}{want[1]} in chunks {want[2]}"
        )
        return None
    if not shape or shape[0] < records:
        fail(f"zarr.json holds {shape[0] if shape else 0} records, {records} are committed")
        return None
    return meta


def _chunk_keys(column: ColumnSpec, records: int) -> list[tuple[tuple[int, ...], str]]:
    grid = [-(-records // column.chunks[0])]
    grid += [-(-n // c) for n, c in zip(column.shape, column.chunks[1:])]
    out = []
    for index in itertools.product(*(range(n) for n in grid)):
        out.append((index, chunk_key(column.key, index)))
    return out


def _check_present(
    backend: Any, column: ColumnSpec, records: int, problems: list[Problem], past: list[str]
) -> None:
    """Reports missing committed chunks; adds the stored chunks past the commit to ``past``."""
    if not isinstance(backend, KeyListing) or 0 in column.shape:
        return
    prefix = chunk_prefix(column.key)
    present = set(backend.list_keys(prefix))
    first = -(-records // column.chunks[0])
    for key in sorted(present):
        row = key[len(prefix) :].split("/", 1)[0]
        if row.isdigit() and int(row) >= first:
            past.append(key)
    for index, key in _chunk_keys(column, records):
        # rows of the chunk that are committed, all before start: read as the default
        before_start = min((index[0] + 1) * column.chunks[0], records) <= column.start
        if key not in present and not before_start:
            problems.append(
                Problem(
                    column.path,
                    key,
                    index,
                    "the chunk is missing: its committed records are lost (reads raise CorruptChunkError)",
                )
            )


def _check_chunks(
    backend: Any,
    requests: Sequence[tuple[ColumnSpec, int]],
    records: int,
    bar: _progress.ProgressBar,
) -> list[Problem]:
    found: list[Problem] = []
    for batch in _batches(requests):
        reads = [
            (c.key, slice(max(i * c.chunks[0], c.start), min((i + 1) * c.chunks[0], records)))
            for c, i in batch
        ]
        for (column, i), error in zip(batch, _read_each(backend, reads, records)):
            if error is not None:
                found.append(_problem(column, i, error))
        bar.advance(len(batch), sum(_chunk_nbytes(c) for c, _ in batch))
    return found


def _batches(
    requests: Sequence[tuple[ColumnSpec, int]],
) -> list[list[tuple[ColumnSpec, int]]]:
    out: list[list[tuple[ColumnSpec, int]]] = [[]]
    size = 0
    for column, i in requests:
        nbytes = _chunk_nbytes(column)
        if out[-1] and size + nbytes > RUNTIME.reads.verify_batch_bytes:
            out.append([])
            size = 0
        out[-1].append((column, i))
        size += nbytes
    return [b for b in out if b]


def _chunk_nbytes(column: ColumnSpec) -> int:
    """Bytes of one whole chunk of ``column`` (its records times their size)."""
    return column.chunks[0] * column.dtype.itemsize * math.prod(column.shape)


def _read_each(
    backend: Any, reads: list[tuple[str, slice]], records: int
) -> list[PyTreeStoreError | None]:
    """Reads every ``(key, slice)`` and returns each read's error (None where it worked)."""
    if isinstance(backend, CheckedReads):
        return backend.read_checked(reads, records)
    errors: list[PyTreeStoreError | None] = []
    for key, index in reads:
        try:
            backend.read([key], index, records)
            errors.append(None)
        except CorruptStoreError as err:
            errors.append(err)
    return errors


def _problem(column: ColumnSpec, i: int, error: PyTreeStoreError) -> Problem:
    chunk = getattr(error, "chunk", None) or (i,)
    key = getattr(error, "key", None) or chunk_key(column.key, chunk)
    return Problem(column.path, key, tuple(chunk), f"damaged: {error.__cause__ or error}")
