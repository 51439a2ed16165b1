"""The read side: indices, host reads, device placement, sharded loads."""
