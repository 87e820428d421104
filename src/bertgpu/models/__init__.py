"""The encoders and their heads, pure PyTorch modules with Hugging Face parameter names.

`bert.py` is BERT (HF `modeling_bert.py` names and math; its config in `bert_config.py`);
`layers.py` holds what every encoder shares (outputs, per-instance `ModelOptions`, losses);
`attention.py` the attention kernels, the unpadding machinery and the host-side `BatchMeta`;
`hf_io.py` reads and writes Hugging Face folders. Nothing in this package imports
`bertgpu.train` or `bertgpu.data`: a model knows nothing of data loading, parallelism or logging.
"""
