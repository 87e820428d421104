"""Everything that turns a model and batches into a trained model: the config schema, the one
optimizer step (`engine`), the one training loop (`loop`), optimizers, schedules, checkpoints,
data parallelism, automatic micro batch, throughput/MFU accounting and the metrics log.
"""
