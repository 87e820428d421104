"""What a run reports and where it goes: `metrics` (throughput, the metrics log and the progress
line), `console` (its formatting), `records` (metrics.jsonl reading and writing), `sinks`
(TensorBoard, W&B, MLflow), `monitor` (the NVML sampler) and `flops` (peaks and MFU).

`bertgpu watch` and `bertgpu report` use this package without importing the training code.
"""
