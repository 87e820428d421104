"""`bench model --out FILE.csv` writes CSV (its help says so), and `report FILE.csv` refused it
as "not a pretraining run ... bench result file (*.jsonl)": it is now read as the JSONL rows."""

from __future__ import annotations

import pytest
from test_report import _table_rows

from bertgpu.errors import BertgpuError
from bertgpu.report import build_report

_HEADER = ("bench,arch,model,size,micro_batch,seq_len,dtype,compile,compile_mode,padding,lengths,"
           "fwd_ms,bwd_ms,opt_ms,tokens_per_s,mfu,timed_compiles,device,device_name,torch,time\n")


def test_a_bench_model_csv_is_reported_as_its_jsonl_would_be(tmp_path):
    csv = tmp_path / "bm.csv"
    csv.write_text(_HEADER + "model,bert,bertgpu,tiny,2,32,fp32,False,off,padded,full,"
                   "11.84,40.397,4.098,1128.6,,0,cpu,cpu,2.13.0+cpu,1795972412.67\n",
                   encoding="utf-8")
    md = (build_report([csv], tmp_path / "rep") / "README.md").read_text(encoding="utf-8")
    assert "Measured on cpu (torch 2.13.0+cpu)" in md
    assert _table_rows(md)["bert"] == ["tiny", "2", "32", "full", "fp32", "off", "padded",
                                       "bertgpu", "11.8", "40.4", "4.1", "1,129", "0"]


def test_a_csv_that_is_not_a_benchs_is_refused_naming_what_was_expected(tmp_path):
    other = tmp_path / "people.csv"
    other.write_text("name,age\nada,36\n", encoding="utf-8")
    with pytest.raises(BertgpuError, match="expected a CSV file from bertgpu bench model"):
        build_report([other], tmp_path / "rep")
