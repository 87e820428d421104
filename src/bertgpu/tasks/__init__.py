"""Downstream tasks: the GLUE task table and readers, SQuAD v1.1/v2.0, the official metrics, and
the fine-tuning jobs the training loop runs.
"""
