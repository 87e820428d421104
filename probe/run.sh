export PYTHONUNBUFFERED=1 PYTHONPATH=src
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv
timeout -k 5 60 python3 probe/probe.py flash 2>&1 | tail -40
timeout -k 5 120 python3 probe/probe.py bert 2>&1 | grep -v Warning | tail -45
timeout -k 5 100 python3 probe/probe.py lnbf16 2>&1 | grep -v Warning | tail -45
