"""Text to tokens to batches. Nothing here imports the model or the training loop.

Reading: `corpus` (formats, the stream of document parts), `textio` (decompression, UTF-8 lines
in bounded pieces, sentence splitting), `wikitext` (MediaWiki dumps and markup).
Tokenizer: `tokenizer` (WordPiece training, byte-identical from run to run; loading, hashing).
`bertgpu prepare` (documents -> shards + manifest): `prepare` (the command and the manifest),
`pipeline` (the parallel, ordered, bounded-memory stages), `packing` (worker side: tokenizing,
NSP pairs), `split` (train/validation by documents or chunks, at the share asked), `writer`
(row packing, shard files), `segment` (word starts for Chinese whole-word masking).
Training side: `shards` (the memmap reader, manifest checks), `masking` (the deterministic
order and masks), `loaders` (rank-aware, resumable micro batches). `synthetic` writes shard
sets of random words for tests and benchmarks.
"""
