"""Test doubles that ship with the package so the suite can drive the real commands: `faults`
(fault injection through BERTGPU_FAULTS) and `nvml_sim` (a simulated NVML). Production code
reaches them through one hook each and pays nothing when they are off.
"""
