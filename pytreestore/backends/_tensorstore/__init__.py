"""The TensorStore backend: zarr3 driver, kvstores, direct I/O."""
