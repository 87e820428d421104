"""Configuration as code: `schema` (the pretraining schema, the sections every job shares and the
vocabularies of every setting), `finetune` (the fine-tuning schema, flat keys on the same
declarations) and `overrides` (TOML files and `--section.key value` words onto any dataclass
schema). Nothing here imports torch.
"""
