"""A report on a run named with CJK characters (``运行``) printed matplotlib's warning per glyph
and drawing ("Glyph 36816 (\\N{CJK UNIFIED IDEOGRAPH-8FD0}) missing from font(s) DejaVu Sans.",
twice per character), and its legends showed boxes: now an installed font that has the glyphs
is used as a fallback family, and without one the report says so in one line (found by a
probe)."""

from __future__ import annotations

from matplotlib import font_manager
from test_report import _write_jsonl

from bertgpu.cli import main as cli_main
from bertgpu.report import fonts, plots


def _run(folder):
    folder.mkdir(parents=True)
    _write_jsonl(folder / "metrics.jsonl", [
        {"step": s, "kind": "train", "elapsed_s": float(s), "loss": 9.0 - 0.05 * s,
         "mlm_loss": 9.0 - 0.05 * s, "lr": 1e-3, "steps_per_s": 2.0, "tokens_per_s": 1000.0}
        for s in range(10, 70, 10)])
    return folder


def _report(tmp_path, capsys, *names):
    runs = [str(_run(tmp_path / name)) for name in names]
    assert cli_main(["report", *runs, "--out", str(tmp_path / "rep"), "--format", "both"]) == 0
    return capsys.readouterr().err


def test_without_a_cjk_font_one_line_names_the_problem_and_the_remedy(tmp_path, capsys,
                                                                      monkeypatch):
    monkeypatch.setattr(fonts, "fallback_family", lambda chars: None)  # no such font here
    err = _report(tmp_path, capsys, "运行", "数据")
    assert "Glyph" not in err
    lines = [line for line in err.splitlines() if "font" in line]
    assert len(lines) == 1, err
    assert lines[0].startswith("bertgpu report: warning: labels in the plots have characters")
    assert "运" in lines[0] and "Noto Sans CJK" in lines[0]
    assert (tmp_path / "rep" / "loss.png").is_file()


def test_an_installed_font_with_the_glyphs_is_the_fallback_family(tmp_path, capsys,
                                                                  monkeypatch):
    # DejaVu Serif stands for a CJK font: it "has" every CJK character (only its coverage is
    # asked, and matplotlib's own warnings about the drawing are left out)
    serif = font_manager.findfont(font_manager.FontProperties(family="DejaVu Serif"))
    charmap = fonts._charmap

    def covering(path):
        return charmap(path) | frozenset(range(0x4E00, 0xA000)) if path == serif \
            else charmap(path)

    monkeypatch.setattr(fonts, "_charmap", covering)
    monkeypatch.setattr(fonts, "fallback_family", fonts.fallback_family.__wrapped__)
    legends = []
    real_save = plots.save

    def save(fig, folder, name):
        out = real_save(fig, folder, name)
        legends.extend(t for ax in fig.axes if ax.get_legend()
                       for t in ax.get_legend().get_texts())
        return out

    monkeypatch.setattr(plots, "save", save)
    err = _report(tmp_path, capsys, "运行")
    assert "font" not in err and "Glyph" not in err
    assert legends and all(t.get_fontfamily() == ["sans-serif", "DejaVu Serif"]
                           for t in legends if "运" in t.get_text())
    assert any("运" in t.get_text() for t in legends)
