"""Downstream tasks: the GLUE task table and readers, SQuAD v1.1/v2.0, your own labelled files
(classify, ner), the official metrics, and the fine-tuning jobs the training loop runs.

`registry.py` maps every task name to the module that builds its job (`build_job`);
`finetuning.py` holds the contract (`JobRequest` in, `Job` out) and the loop's task object.
"""
