"""Streaming over a store: batches, map, the Grain source."""
