"""The data pipeline: records → tokenised samples → (packed) sequences → micro-batches."""
