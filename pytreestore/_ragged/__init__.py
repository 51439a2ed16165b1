"""Ragged and optional records in a store: the schema, the writer, the reads (format 3)."""
