"""Records of one fixed tree taken as rows of one table: the record side of a row buffer.

:class:`FixedRecords` checks each record's structure against the schema's treedef and hands
its leaves, one row per record, to a table buffer it is given (the table writer
:class:`~pytreestore._write.writer.Writer`, a shared writer's
:class:`~pytreestore._write.coordinated.CoordinatedRows`). A refused record is explained with
the ``ragged=``/``optional=`` entry that would accept it (:func:`hints`).

Example:
    >>> import numpy as np
    >>> from pytreestore._format.schema import TreeSchema
    >>> schema = TreeSchema.from_example({"x": 0})
    >>> print(hints(schema, "refused", {"x": [1, 2]}).splitlines()[0])
    refused
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence

import jax
import numpy as np
from jax.tree_util import keystr, tree_flatten, tree_flatten_with_path

from pytreestore import _arguments
from pytreestore._format.schema import TreeSchema
from pytreestore._runtime import RUNTIME
from pytreestore._tree.convert import RecordError, RowFiller
from pytreestore._tree.device import VALID, refuse_unreadable
from pytreestore._tree.flatten import BlockFlattener, block_flattener
from pytreestore._tree.layout import hinted, record_problems
from pytreestore._tree.stack import batch_length
from pytreestore._write.roles import Block, Row, TableBuffer
from pytreestore.errors import SchemaMismatchError

#: how a refused record of ``extend`` (``{i}``: its position), a refused batch, and a batch
#: given a mask by a store of one structure (``{where}``: the store) are reported
REFUSALS = (
    "extend() refused record {i} (none of this call's records were appended)",
    "extend_batch() refused the batch (none of its records were appended)",
    "store {where} holds records of one structure: extend_batch takes no mask= (that is for "
    "stores created with ragged= or optional=)",
)


class FixedRecords:
    """Records of one fixed tree taken as rows of one table, ``table``: each record checked
    against the schema's treedef, its leaves one row. The records of a fixed store's
    :class:`~pytreestore._write.records.RecordWriter`, over any table buffer (a
    :class:`~pytreestore._write.writer.Writer`, a shared writer's
    :class:`~pytreestore._write.coordinated.CoordinatedRows`, a fragment's
    :class:`~pytreestore._write.commits.TableRows`); ``refusals``: the writer's
    (:data:`REFUSALS`)."""

    def __init__(
        self,
        table: TableBuffer,
        refusals: tuple[str, str, str] = REFUSALS,
        first: Callable[[], int] = lambda: 0,
    ) -> None:
        """``first``: the row of record 0 (``keep_last``), to number records in errors."""
        self.table = table
        self._first = first
        self.refusal, self.batch_refusal, self.mask_refusal = refusals
        #: the schema the block flattener was made for, and the flattener (see :meth:`extend`)
        self._flattened: tuple[TreeSchema, BlockFlattener | None] | None = None

    @property
    def schema(self) -> TreeSchema:
        """The table's schema (a fixed store's)."""
        return self.table.schema

    def append_record(self, record: object) -> None:
        """Buffers one record after checking its structure against the schema."""
        leaves, treedef = tree_flatten(record)
        schema = self.schema
        if not schema.holds(treedef):
            message = hints(schema, schema.mismatch_message(record), record)
            raise SchemaMismatchError(message + batch_hint(schema, record, FIXED_BATCH))
        try:
            self.table.append(schema.column_leaves(leaves))
        except SchemaMismatchError as err:
            message = hints(schema, str(err), record)
            raise SchemaMismatchError(message + batch_hint(schema, record, FIXED_BATCH)) from None
        except Exception as err:  # JAX's, reading a jax.Array: deleted, or its computation failed
            refuse_unreadable(err, record, "", whose=f"record {len(self.table) - self._first()}'s")
            raise

    def _flattener(self) -> BlockFlattener | None:
        """The block flattener of the schema's records (None: each record by itself), made
        once per schema (by identity: JAX's treedefs of two dataclasses of the same fields
        compare equal)."""
        made = self._flattened
        if made is None or made[0] is not self.schema:
            made = self._flattened = (self.schema, block_flattener(self.schema.treedef))
        return made[1]

    def extend(self, records: Iterable[object]) -> None:
        """Buffers every record of ``records``, all or none, committing whole chunks.

        Records are taken ``RUNTIME.writes.extend_block`` at a time; a block whose records all have
        the schema's
        structure is flattened at once (:class:`~pytreestore._tree.flatten.BlockFlattener`),
        any other record by ``tree_flatten`` and its treedef. A list or tuple of records
        whose columns take at most ``RUNTIME.writes.stacked_bytes`` is stacked into whole columns
        and
        written as one batch (``write_batch``, as ``extend_batch`` does); anything else is
        handed to the row buffer a block at a time (:meth:`append_blocks`).

        Raises:
            SchemaMismatchError: a record was refused (the error names its position); none
                of ``records`` is kept.
            ArgumentTypeError: ``records`` is not iterable.
        """
        records = _arguments.iterable(records, "extend()", "records")
        schema = self.schema
        rows = _Blocks(schema, records, self._flattener())
        position = self.table.snapshot()
        try:
            count = stackable(records, schema)
            if count is not None:
                self._write_stacked(rows, count)
            else:
                self.table.append_blocks(rows.blocks())
        except (SchemaMismatchError, RecordError) as err:
            self.table.rollback(position)
            index, cause = (
                (err.index, err.error) if isinstance(err, RecordError) else (rows.seen, err)
            )
            why = str(cause)
            record = rows.record(index) if isinstance(err, RecordError) else None
            if record is not None:
                why = hints(schema, why, record[0])
            raise SchemaMismatchError(f"{self.refusal.format(i=index)}: {why}") from cause
        except BaseException as err:
            self.table.rollback(position)
            rows.refuse_unreadable(err, self.refusal + ": ")
            raise

    def _write_stacked(self, rows: _Blocks, count: int) -> None:
        """Fills whole columns of ``count`` records from ``rows``' blocks, then writes them
        as one batch.

        Raises:
            RecordError: a record was refused (``index`` counted from the first); nothing
                was written.
        """
        columns = [np.empty((count, *c.shape), c.dtype) for c in self.schema.columns]
        filler, done = RowFiller(self.table.casters, columns), 0
        for block, n in rows.blocks():
            try:
                filler.fill_columns(block, done, n)
            except RecordError as err:
                raise RecordError(done + err.index, err.error) from err.error
            done += n
        if done:
            self.table.write_batch(columns if done == count else [c[:done] for c in columns])

    def extend_batch(
        self, batch: object, mask: object = None, *, where: str = "this store"
    ) -> None:
        """Buffers a batched record (leaves with a leading record axis), all or none.

        Raises:
            SchemaMismatchError: a ``mask`` (records of one structure pad nothing; ``where``
                names the store), or a batch not of the schema's structure.
        """
        if mask is not None:
            raise SchemaMismatchError(self.mask_refusal.format(where=where))
        leaves, treedef = tree_flatten(batch)
        schema = self.schema
        if not schema.holds(treedef):
            message = schema.mismatch_message(batch, what="batch")
            raise SchemaMismatchError(hints(schema, message, batch, batched=True))
        leaves = schema.column_leaves(leaves)
        count = batch_length(leaves, schema.paths)
        try:
            blocks = [
                c.coerce(leaf, batch=count, what="batch")
                for c, leaf in zip(self.table.casters, leaves)
            ]
        except SchemaMismatchError as err:
            raise SchemaMismatchError(hints(schema, str(err), batch, batched=True)) from None
        except Exception as err:  # JAX's, reading a jax.Array of the batch
            refuse_unreadable(err, batch, self.batch_refusal + ": ", fix=VALID)
            raise
        if count == 0:
            return
        position = self.table.snapshot()
        try:
            self.table.write_batch(blocks)
        except BaseException:
            self.table.rollback(position)
            raise


def stackable(records: Iterable[object], schema: TreeSchema) -> int | None:
    """The number of ``records`` if they are a list or tuple (not a subclass, which may
    iterate otherwise than its ``len()`` says) whose columns fit ``RUNTIME.writes.stacked_bytes``,
    else
    None."""
    if type(records) is not list and type(records) is not tuple:
        return None
    count = len(records)
    return (
        count
        if count * sum(c.record_nbytes for c in schema.columns) <= RUNTIME.writes.stacked_bytes
        else None
    )


class _Blocks:
    """The records of one ``extend()``, a block at a time as the columns of its rows
    (column order), each block checked against ``schema``'s treedef: flattened at once when
    every record has its structure, else record by record.

    Attributes:
        seen: the index of the record being checked (all before it were accepted).
    """

    def __init__(
        self, schema: TreeSchema, records: Iterable[object], flat: BlockFlattener | None
    ) -> None:
        self.schema = schema
        self.records = records
        self.seen = 0
        self.flat = flat
        # the last blocks, (first index, records), for naming a refused record: they cover
        # every row a row buffer has taken but not yet filled (a chunk at most)
        self.recent: collections.deque[tuple[int, list[object]]] = collections.deque(
            maxlen=schema.chunk_records // RUNTIME.writes.extend_block + 2
        )

    def record(self, index: int) -> tuple[object] | None:
        """``(record,)`` for the record at ``index``, if it is one of the recent blocks'."""
        for start, block in self.recent:
            if start <= index < start + len(block):
                return (block[index - start],)
        return None

    def blocks(self) -> Iterator[Block]:
        """``(columns, count)`` for each block of records, once (see ``append_blocks``)."""
        records = iter(self.records)
        while block := list(itertools.islice(records, RUNTIME.writes.extend_block)):
            start = self.seen
            self.recent.append((start, block))
            yield self._columns(block), len(block)
            self.seen = start + len(block)

    def refuse_unreadable(self, err: BaseException, head: str) -> None:
        """After taking the records raised ``err``: raises the error for the first record of
        the recent blocks with a ``jax.Array`` that cannot be read (``head`` formatted with
        its index ``i``), if ``err`` is JAX's
        (:func:`~pytreestore._tree.device.refuse_unreadable`)."""
        for start, block in self.recent:
            for i, record in enumerate(block, start):
                refuse_unreadable(err, record, head.format(i=i), fix=VALID)

    def _columns(self, block: list[object]) -> Sequence[Sequence[object]]:
        columns = self.flat.columns(block) if self.flat is not None else None
        if columns and self.seen == 0 and not self._agrees(block[0], columns):
            columns = None  # a structure the flattener takes otherwise: never here
        if not columns:  # None: not all of the schema's structure (or no leaves at all)
            return list(zip(*self._one_by_one(block)))
        if self.schema.binding is None:
            return columns
        return list(zip(*self._one_by_one(block, zip(*columns))))

    def _agrees(self, record: object, columns: Sequence[Sequence[object]]) -> bool:
        """Whether ``tree_flatten`` of the first record gives the schema's treedef and the
        leaves that the block flattener gave it (a check of the flattener, once a call)."""
        leaves, got = tree_flatten(record)
        return self.schema.holds(got) and all(
            a is b for a, b in zip(leaves, (c[0] for c in columns), strict=True)
        )

    def _one_by_one(
        self, block: list[object], flattened: Iterator[tuple[object, ...]] | None = None
    ) -> Iterator[Row]:
        """The rows of ``block``, each record flattened and checked by itself (or taken from
        ``flattened``, already checked), then bound to the columns."""
        schema = self.schema
        for record in block:
            if flattened is not None:
                leaves = list(next(flattened))
            else:
                leaves, got = tree_flatten(record)
                if not schema.holds(got):
                    message = schema.mismatch_message(record)
                    raise SchemaMismatchError(hints(schema, message, record))
            yield schema.column_leaves(leaves)
            self.seen += 1


def _rows(columns: Sequence[Sequence[object]], count: int) -> Iterator[Row]:
    """The ``count`` rows of a block's ``columns`` (rows of nothing: no columns)."""
    return zip(*columns) if columns else itertools.repeat((), count)


def block_rows(blocks: Iterator[Block]) -> Iterator[Row]:
    """The rows of blocks given as ``(columns, count)``, in order (for a table buffer that
    takes them a row at a time)."""
    return itertools.chain.from_iterable(_rows(c, n) for c, n in blocks)


def hints(schema: TreeSchema, message: str, record: object, *, batched: bool = False) -> str:
    """``message`` (a fixed store refusing ``record``, or the first record of a ``batched``
    one) with the ``ragged=``/``optional=`` entry that would accept each difference, as
    ``stack()`` says it: the store's schema describes a record of zeros to compare with."""

    def problems() -> list[tuple[str, str]]:
        like = schema.unflatten([np.zeros(c.shape, c.dtype) for c in schema.columns])
        one = jax.tree.map(lambda x: x[0], record) if batched else record
        return record_problems(like, one)

    header = "The batch's first record differs at:" if batched else "Every differing keypath:"
    return hinted(message, problems, header)


#: how a fixed store appends a batch, and a ragged or optional store (:func:`batch_hint`)
FIXED_BATCH = "store.extend_batch(batch)"
MASKED_BATCH = (
    "store.extend_batch(batch, mask), with the mask of its real values (the pair "
    "store.load(index) returns)"
)


def batch_hint(schema: TreeSchema, record: object, call: str) -> str:
    """The hint for an ``append`` of a batch of records: when every leaf of ``record`` at a
    leaf column of the record table is that column's leaf with one more leading axis, of
    one size ``n`` for all, a sentence saying so and naming ``call``; else ``""``.

    Example:
        >>> schema = TreeSchema.from_example({"a": np.int32(0), "b": np.zeros(2, np.float32)})
        >>> batch = {"a": np.zeros(32, np.int32), "b": np.zeros((32, 2), np.float32)}
        >>> batch_hint(schema, batch, FIXED_BATCH).split(":")[0].strip()
        'This looks like a batch of 32 records (its leaves have one more leading axis, of size 32)'
        >>> batch_hint(schema, {"a": np.zeros(3, np.int32), "b": np.zeros(2)}, FIXED_BATCH)
        ''
    """
    shapes = {keystr(p): np.shape(x) for p, x in tree_flatten_with_path(record)[0]}
    sizes = set()
    for c in schema.columns:
        shape = shapes.get(c.path) if c.table is None and c.role is None else None
        if shape is None:
            continue
        if len(shape) != len(c.shape) + 1 or tuple(shape[1:]) != tuple(c.shape):
            return ""
        sizes.add(int(shape[0]))
    if len(sizes) != 1:
        return ""
    n = sizes.pop()
    return (
        f"\nThis looks like a batch of {n} records (its leaves have one more leading axis, "
        f"of size {n}): append them with {call}."
    )


__all__ = [
    "FIXED_BATCH",
    "MASKED_BATCH",
    "REFUSALS",
    "FixedRecords",
    "batch_hint",
    "block_rows",
    "hints",
    "stackable",
]
