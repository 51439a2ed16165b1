"""The ``pytreestore`` command: look into stores, check them and copy them from a shell.

``pytreestore info PATH`` draws the column tree with dtypes, shapes, chunks and sizes;
``head PATH -n N`` prints the first records; ``verify PATH`` checks every column against the
commit; ``versions PATH`` lists the store's versions; ``copy SRC DST`` rechunks, recompresses,
repacks or moves a store. Every command takes ``--help``; ``info``, ``head``, ``verify``, ``versions``
and ``copy`` take ``--json`` for scripts.

Exit status: 0 on success, 1 when ``verify`` finds problems, 2 for a usage error or a store
that cannot be opened or written.

Example:
    >>> from click.testing import CliRunner
    >>> result = CliRunner().invoke(main, ["--help"])
    >>> result.exit_code, "info" in result.output
    (0, True)
"""

from __future__ import annotations

from pytreestore._cli import commands as check  # noqa: F401 (each registers its commands)
from pytreestore._cli.common import EXIT_ERROR, EXIT_PROBLEMS, main

__all__ = ["EXIT_ERROR", "EXIT_PROBLEMS", "main"]

if __name__ == "__main__":  # pragma: no cover
    main()
