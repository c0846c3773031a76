"""Data sources (one module each), the prepared Parquet schema and the verified downloader."""

from pipeline.data.schema import SequenceDataset, read_dataset, write_dataset

__all__ = ["SequenceDataset", "read_dataset", "write_dataset"]
