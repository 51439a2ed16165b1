"""Records of one fixed tree taken as rows of one table: the record side of a row buffer.

:class:`FixedTreeRows` checks each record's structure against the schema's treedef and hands
its leaves, one row per record, to the row buffer of a subclass (the table writer
:class:`~pytreestore._commit.writer.Writer`, a shared writer's
:class:`~pytreestore._commit.coordinated.CoordinatedRows`). A refused record is explained with
the ``ragged=``/``optional=`` entry that would accept it (:func:`hints`).

Example:
    >>> import numpy as np
    >>> from pytreestore._format.schema import TreeSchema
    >>> schema = TreeSchema.from_example({"x": 0})
    >>> print(hints(schema, "refused", {"x": [1, 2]}).splitlines()[0])
    refused
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import jax
import numpy as np
from jax.tree_util import tree_flatten

from pytreestore import _arguments
from pytreestore._format.schema import TreeSchema
from pytreestore._tree.convert import LeafCaster, RecordError
from pytreestore._tree.hints import hinted, record_problems
from pytreestore._tree.stack import batch_length
from pytreestore.errors import SchemaMismatchError


class FixedTreeRows:
    """Records of one fixed tree taken as rows of one table: each record checked against the
    schema's treedef, its leaves one row. The base of every row buffer that takes records
    (:class:`Writer`; a shared writer's
    :class:`~pytreestore._commit.coordinated.CoordinatedRows`): the fast path of a fixed
    store's :class:`~pytreestore._commit.records.RecordWriter`.

    A subclass gives the schema, its casters and the row buffer's methods named below.
    """

    schema: TreeSchema
    casters: list[LeafCaster]
    append: Callable[[Sequence[Any]], None]
    append_many: Callable[[Iterator[Sequence[Any]]], None]
    write_batch: Callable[[Sequence[np.ndarray]], None]
    snapshot: Callable[[], tuple[int, int]]
    rollback: Callable[[tuple[int, int]], None]

    def append_record(self, record: Any) -> None:
        """Buffers one record after checking its structure against the schema."""
        leaves, treedef = tree_flatten(record)
        schema = self.schema
        if treedef != schema.treedef:
            raise SchemaMismatchError(hints(schema, schema.mismatch_message(record), record))
        try:
            self.append(schema.column_leaves(leaves))
        except SchemaMismatchError as err:
            raise SchemaMismatchError(hints(schema, str(err), record)) from None

    def extend(self, records: Iterable[Any]) -> None:
        """Buffers every record of ``records``, all or none, committing whole chunks.

        Raises:
            SchemaMismatchError: a record was refused (the error names its position); none
                of ``records`` is kept.
            ArgumentTypeError: ``records`` is not iterable.
        """
        records = _arguments.iterable(records, "extend()", "records")
        schema, seen = self.schema, [0]
        recent: dict[int, Any] = {}  # the records of the block being filled, for hints

        def checked() -> Iterator[list[Any]]:
            for record in records:
                leaves, got = tree_flatten(record)
                if got != schema.treedef:
                    message = schema.mismatch_message(record)
                    raise SchemaMismatchError(hints(schema, message, record))
                if len(recent) >= schema.chunk_records:
                    recent.pop(next(iter(recent)))
                recent[seen[0]] = record
                yield schema.column_leaves(leaves)
                seen[0] += 1

        position = self.snapshot()
        try:
            self.append_many(checked())
        except (SchemaMismatchError, RecordError) as err:
            self.rollback(position)
            index, cause = (
                (err.index, err.error) if isinstance(err, RecordError) else (seen[0], err)
            )
            why = str(cause)
            if isinstance(err, RecordError) and index in recent:
                why = hints(schema, why, recent[index])
            raise SchemaMismatchError(
                f"extend() refused record {index} (none of this call's records were "
                f"appended): {why}"
            ) from cause
        except BaseException:
            self.rollback(position)
            raise

    def extend_batch(self, batch: Any, mask: Any = None, *, where: str = "this store") -> None:
        """Buffers a batched record (leaves with a leading record axis), all or none.

        Raises:
            SchemaMismatchError: a ``mask`` (records of one structure pad nothing; ``where``
                names the store), or a batch not of the schema's structure.
        """
        if mask is not None:
            raise SchemaMismatchError(
                f"store {where} holds records of one structure: extend_batch takes no mask= "
                "(that is for stores created with ragged= or optional=)"
            )
        leaves, treedef = tree_flatten(batch)
        schema = self.schema
        if treedef != schema.treedef:
            message = schema.mismatch_message(batch, what="batch")
            raise SchemaMismatchError(hints(schema, message, batch, batched=True))
        leaves = schema.column_leaves(leaves)
        count = batch_length(leaves, schema.paths)
        try:
            blocks = [
                c.coerce(leaf, batch=count, what="batch") for c, leaf in zip(self.casters, leaves)
            ]
        except SchemaMismatchError as err:
            raise SchemaMismatchError(hints(schema, str(err), batch, batched=True)) from None
        if count == 0:
            return
        position = self.snapshot()
        try:
            self.write_batch(blocks)
        except BaseException:
            self.rollback(position)
            raise


def hints(schema: TreeSchema, message: str, record: Any, *, batched: bool = False) -> str:
    """``message`` (a fixed store refusing ``record``, or the first record of a ``batched``
    one) with the ``ragged=``/``optional=`` entry that would accept each difference, as
    ``stack()`` says it: the store's schema describes a record of zeros to compare with."""

    def problems() -> list[tuple[str, str]]:
        like = schema.unflatten([np.zeros(c.shape, c.dtype) for c in schema.columns])
        one = jax.tree.map(lambda x: x[0], record) if batched else record
        return record_problems(like, one)

    header = "The batch's first record differs at:" if batched else "Every differing keypath:"
    return hinted(message, problems, header)


__all__ = ["FixedTreeRows", "hints"]
