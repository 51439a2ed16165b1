"""The write side: the writer, the commit protocol, the writer lock, repair, evolve."""
