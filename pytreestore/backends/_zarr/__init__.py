"""The zarr-python backend: local, memory and S3 (obstore), dtypes."""
