"""The on-disk format: names, schema, treedef encoding, values, dtypes, validation."""
