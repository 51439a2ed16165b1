"""Fragments: records written under a store by any process, without the writer lock, and
appended by its writer in one commit (``pytreestore.write_fragment``,
``store.commit_fragments``). One path for every store: a store of one fixed structure is a
store whose only table is the record table, and whose fragments learn no structure.

Modules, one concept each:

* :mod:`~pytreestore._fragments.cast`: records checked and cast in memory into each table's
  rows;
* :mod:`~pytreestore._fragments.write`: a fragment written under its folder;
* :mod:`~pytreestore._fragments.write`: a fragment's arrays, laid out like the store's
  columns, and placed into them at a commit;
* :mod:`~pytreestore._fragments.fastpath`: chunks placed unchanged (renamed folders and
  linked files on local disk, keys copied in OCDBT);
* :mod:`~pytreestore._fragments.check` and :mod:`~pytreestore._fragments.check`: what a
  commit checks before writing anything;
* :mod:`~pytreestore._fragments.commit`: the commit sequence;
* :mod:`~pytreestore._fragments.fragment` and :mod:`~pytreestore._fragments.fragment`:
  deleting fragments' folders, after their commit and by vacuum's sweep;
* :mod:`~pytreestore._fragments.multihost` and
  :mod:`~pytreestore._fragments.multihost`: multi-host ``extend_batch``, each
  process's rows written as fragments that process 0 commits.

Below it, in :mod:`pytreestore._commit`: the :class:`~pytreestore.Fragment` description (a
record of the format, beside the commit record; pickles name
``pytreestore._fragments.fragment``) and the intent record of renamed chunk-row folders
(:mod:`pytreestore._log.placing`), which the commit protocol settles before it repairs a
store. Above it: ``write_fragment`` (:mod:`pytreestore._open.sharing`) and
``commit_fragments`` (:class:`~pytreestore._fragments.commit.Fragmenting`).
"""
