"""Looking at a store: repr, verify, progress bars."""
