"""Tiny ModernBERT configs shared by the ModernBERT tests (the batch is `_tiny.tiny_batch`).

The sliding window (local_attention=4: two tokens each side) is much shorter than the batch's
11 columns, and layers 1 and 2 are local, 0 and 3 global, so both kinds of layer matter.
"""

from __future__ import annotations

TINY_MODERN = dict(vocab_size=99, hidden_size=32, intermediate_size=40, num_hidden_layers=4,
                   num_attention_heads=4, local_attention=4, global_attn_every_n_layers=3,
                   max_position_embeddings=64, pad_token_id=0, bos_token_id=2, eos_token_id=3,
                   cls_token_id=2, sep_token_id=3)

# Every optional bias and the other activations switched on, a window of 6, global every 2nd layer.
TINY_MODERN_BIASED = dict(TINY_MODERN, norm_bias=True, attention_bias=True, mlp_bias=True,
                          decoder_bias=False, classifier_bias=True,
                          hidden_activation="gelu_pytorch_tanh", classifier_activation="silu",
                          local_attention=6, global_attn_every_n_layers=2, global_rope_theta=1000.0,
                          local_rope_theta=50.0)
