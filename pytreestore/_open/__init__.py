"""Where a store lives and how it is opened, created and copied."""
