"""The ``pytreestore`` command, one module per concept (see :mod:`pytreestore.cli`)."""
