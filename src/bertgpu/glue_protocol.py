"""The fine-tuning protocol a GLUE table names, so that a reader can reproduce the table and never
mistakes a subset table for GLUE dev: its line in glue_results.md, and its words in
glue_results.json's "protocol" (text, subset), which `bertgpu report` quotes.
"""

from __future__ import annotations

from typing import Any


def peak_lr(runs: dict[str, dict[int, dict[str, Any]]], c: dict[str, Any]) -> float | None:
    """The peak lr the runs trained with (results.json peak_lr: --lr after --lr_scaling; the
    table said the --lr given, 1e-4, over runs that trained at 4e-4), else --lr scaled here."""
    from bertgpu.config.schema import scaled_lr

    used = {r["peak_lr"] for per_seed in runs.values() for r in per_seed.values()
            if isinstance(r.get("peak_lr"), float)}
    if len(used) == 1:
        return used.pop()
    if c["lr"] is None:
        return None
    return scaled_lr(c["lr"], c["global_batch_size"], c["reference_batch_size"], c["lr_scaling"])


IN_THE_LINE = ("seed", "epochs", "lr", "lr_scaling", "reference_batch_size", "global_batch_size",
               "max_seq_len", "warmup_fraction", "decay", "weight_decay", "precision", "optimizer",
               "max_train_examples", "max_eval_examples")
"""The settings the protocol line words itself; `other_settings` names the rest."""
SQUAD_ONLY = ("doc_stride", "max_query_len", "n_best", "max_answer_len", "null_threshold")


def other_settings(c: dict[str, Any]) -> dict[str, Any]:
    """Every other setting that changes the scores (not how a run logs or checkpoints:
    RESUME_NEUTRAL) given away from its default (--hidden_dropout_prob 0 was left out, so the
    line did not say how to reproduce the table)."""
    from bertgpu.config.finetune import FinetuneConfig
    from bertgpu.config.overrides import config_to_dict
    from bertgpu.tasks.finetune_output import RESUME_NEUTRAL

    defaults = config_to_dict(FinetuneConfig())
    return {k: v for k, v in c.items() if k not in (*IN_THE_LINE, *SQUAD_ONLY, *RESUME_NEUTRAL)
            and v != defaults.get(k)}


def _setting(value: Any) -> str:
    """A setting's value as given on the command line: 0 not 0.0, true not True."""
    if isinstance(value, bool):
        return str(value).lower()
    return format(value, "g") if isinstance(value, float) else str(value)


def _examples(n: int, what: str) -> str:
    return f"the first {n} {what}{'s' * (n != 1)}"


def subset_text(p: dict[str, Any]) -> str | None:
    """Why a table of --max_eval_examples / --max_train_examples runs is not GLUE dev (it read
    as a full table, beside published rows), or None for a full one."""
    train, dev = p.get("max_train_examples"), p.get("max_eval_examples")
    if train is None and dev is None:
        return None
    said = ([f"scores on {_examples(dev, 'example')} of each dev split"] if dev is not None
            else []) + ([f"trained on {_examples(train, 'example')} of each task's training set"]
                        if train is not None else [])
    flags = " ".join(f"--{k} {p[k]}" for k in ("max_eval_examples", "max_train_examples")
                     if p.get(k) is not None)
    return (f"Subset ({flags}): {', '.join(said)}; not comparable with full GLUE dev results "
            "or published rows")


def protocol_text(p: dict[str, Any]) -> str:
    """The protocol line (without "Protocol: "): what a reader needs to reproduce the table.
    The lr as the runs used it, with the --lr and scaling that gave it; the optimizer; every
    other setting that changes the scores and was given away from its default. Reads older
    protocols, without those keys, as before."""
    lr, scaling = p["lr"], p.get("lr_scaling")
    how = [f"{scaling['lr']:g} x {scaling['rule']} scaling from batch "
           f"{scaling['reference_batch_size']}"] if scaling else []
    how += [f"{p['decay']} decay", f"{p['warmup_fraction']:.0%} warm-up"]
    optimizer = (f"{p['optimizer']} (weight decay {p['weight_decay']:g}), "
                 if p.get("optimizer") else "")
    other = "".join(f", {k} {_setting(v)}" for k, v in (p.get("other") or {}).items())
    train = p.get("max_train_examples")
    dev = p.get("max_eval_examples")
    return (f"fine-tuning {p['epochs']} epoch{'s' * (p['epochs'] != 1)}"
            + (f" on {_examples(train, 'training example')} of each task"
               if train is not None else "")
            + f", {optimizer}lr {'by model size' if lr is None else format(lr, 'g')} "
            f"({', '.join(how)}), batch {p['global_batch_size']}, max_seq_len "
            f"{p['max_seq_len']}, {p['precision']}{other}, seeds "
            f"{' '.join(map(str, p['seeds']))}; each cell is the {p['aggregate']} of the "
            f"{p['checkpoint']} dev score"
            + (f" on {_examples(dev, 'example')} of each dev split" if dev is not None else ""))
