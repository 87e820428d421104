"""Text to tokens to batches: corpus readers, WordPiece tokenizer, `bertgpu prepare` (documents ->
shards + manifest), the shard reader, the deterministic order and masks, and the rank-aware loaders.

Nothing here imports the model or the training loop.
"""
