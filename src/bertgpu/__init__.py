"""bertgpu: pretrain BERT encoders from raw text and fine-tune them on GLUE and SQuAD.

Public API::

    import bertgpu
    model = bertgpu.load_pretrained("path/to/hf_or_run_folder", head="classification", num_labels=3)
    bertgpu.save_pretrained(model, "out/", tokenizer="tok/")

Importing the package does no work (no torch import) until one of these is used.
"""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["__version__", "load_pretrained", "save_pretrained"]


def __getattr__(name: str):
    if name == "load_pretrained":
        from bertgpu.models.hf_io import load_pretrained

        return load_pretrained
    if name == "save_pretrained":
        from bertgpu.models.hf_export import save_pretrained

        return save_pretrained
    raise AttributeError(f"module 'bertgpu' has no attribute {name!r}")
