"""The columns of a `bertgpu bench model` row as people read them: the console's table at the
end of a run and the report's table of a result file are both made from this one list, so a
report of `bench model --out FILE` shows what the run printed, not the row's 40-odd fields."""

from __future__ import annotations

from typing import Any

MODEL_COLUMNS = [
    ("arch", "arch"), ("size", "size"), ("micro_batch", "B"), ("seq_len", "T"),
    ("lengths", "lengths"), ("dtype", "dtype"), ("compile_mode", "compile"),
    ("padding", "padding"), ("model", "model"), ("fwd_ms", "fwd ms"), ("bwd_ms", "bwd ms"),
    ("opt_ms", "opt ms"), ("tokens_per_s", "tokens/s"), ("mfu", "MFU"),
    ("vs_hf_eager", "vs HF eager"), ("vs_hf_compiled", "vs HF compiled"),
    ("unpadded_vs_padded", "unpadded/padded"), ("compile_s", "compile s"),
    ("timed_compiles", "timed compiles"), ("mem_peak_gib", "mem GiB")]
"""(row key, heading) of `bench model`'s full table, in order."""


def fmt_model_value(key: str, value: Any) -> str:
    """One cell of that table: MFU in %, ratios as 1.23x, tokens/s with thousands, "-" for
    none."""
    if value is None:
        return "-"
    if key == "mfu":
        return f"{100 * value:.1f}%"
    if key in ("vs_hf_eager", "vs_hf_compiled", "unpadded_vs_padded"):
        return f"{value:.2f}x"
    if key == "tokens_per_s":
        return f"{value:,.0f}"
    if key == "lengths" and len(str(value)) > 24:
        return "..." + str(value)[-21:]
    if isinstance(value, float):
        return f"{value:.1f}" if key.endswith("_ms") or key == "compile_s" else f"{value:.2f}"
    return str(value)


def model_table(rows: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """(headings, cells) of `bench model` rows, leaving out the columns no row has."""
    columns = [(k, h) for k, h in MODEL_COLUMNS if any(r.get(k) is not None for r in rows)]
    return [h for _, h in columns], [[fmt_model_value(k, r.get(k)) for k, _ in columns]
                                     for r in rows]


__all__ = ["MODEL_COLUMNS", "fmt_model_value", "model_table"]
