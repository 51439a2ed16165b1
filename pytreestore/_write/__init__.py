"""The write side: the record writer, its table buffers (on storage or in memory), its committers and its background chunk writes."""
