"""``python -m pytreestore``: the same as the ``pytreestore`` command."""

from pytreestore.cli import main

main(prog_name="pytreestore")
