"""The pretraining plots were titled "Loss" and "Throughput", the throughput axis started at
its lowest point (a dip read as a collapse), its ticks were "600000", and the step axis of a
run that logs every 10 steps was ticked at 12, 18, 24, between the points."""

from __future__ import annotations

from test_report import _write_jsonl

from bertgpu.report import build_report, plots


def test_pretraining_plots_are_titled_start_rates_at_zero_and_tick_readably(tmp_path,
                                                                           monkeypatch):
    figures = {}
    real_save = plots.save

    def save(fig, folder, name):
        fig.canvas.draw()  # ticks as they are drawn
        figures[name] = fig.axes[0]
        return real_save(fig, folder, name)

    monkeypatch.setattr(plots, "save", save)
    run = tmp_path / "big"
    run.mkdir()
    _write_jsonl(run / "metrics.jsonl", [
        {"step": s, "kind": "train", "elapsed_s": float(s), "loss": 9.0 - 0.05 * s,
         "mlm_loss": 9.0 - 0.05 * s, "lr": 1e-3, "steps_per_s": 2.0,
         "tokens_per_s": 600000.0 + 1000 * (s % 20)} for s in range(10, 70, 10)])
    build_report([run], tmp_path / "rep")
    loss, rate = figures["loss.png"], figures["throughput.png"]
    assert loss.get_title() == "Train and validation MLM loss by optimizer step"
    assert rate.get_title() == "Training throughput over each logged interval"
    assert rate.get_ylim()[0] == 0
    assert "600,000" in [t.get_text() for t in rate.get_yticklabels()]
    steps = [t for t in rate.get_xticks() if 10 <= t <= 60]
    assert steps and all(t % 10 == 0 for t in steps)
