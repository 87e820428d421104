"""Text to tokens to batches. Nothing here imports the model or the training loop.

Reading: `corpus` (formats, the stream of document parts), `compressed` (gzip, bzip2 and zstd
on the fly, damaged streams), `textio` (UTF-8 lines in bounded pieces, sentence splitting),
`wikitext` (MediaWiki dumps and markup).
Tokenizer: `tokenizer` (WordPiece training, byte-identical from run to run; loading, hashing).
`bertgpu prepare` (documents -> shards + manifest): `prepare` (the command, what goes in the
manifest), `pipeline` (the parallel, ordered, bounded-memory stages), `packing` (worker side:
tokenizing, NSP pairs), `split` (train/validation by documents or chunks, at the share asked),
`writer` (row packing; the one shard-set writer: shard files, then manifest.json), `segment`
(word starts for Chinese whole-word masking). `manifest`: manifest.json as a dataclass, checked.
Training side: `shards` (the memmap reader), `masking` (the deterministic
order and masks), `loaders` (rank-aware, resumable micro batches). `synthetic` writes shard
sets of random words for tests and benchmarks.
"""
