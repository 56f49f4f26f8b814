#!/usr/bin/env bash
# One call on the device machine: the GPU sweeps (benchmarks/gpu/measure.py), then, alone on the
# machine's cores, the 4/8-rank gloo validation (benchmarks/gpu/gloo_many_cores.py) with whatever
# time is left of TOTAL seconds. Sequential on purpose: on the first H200 call the two ran side by
# side and the gloo calibration, made beside the GPU benchmark, had the CPU ranks 3.5-27% slower than
# during the launches after it (the speed probe), which spoils every case's prediction.
# Writes $OUT/gpu.tgz, $OUT/gloo.tgz and $OUT/log.txt.   QUICK=1: the CPU smoke version.
set -u
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then  # simpy is not on the device image: carried as a wheel
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONPATH=${PYTHONPATH:-$PWD}
q=${QUICK:+--quick}
TOTAL=${TOTAL:-540}   # seconds for the whole call (the device tool's limit is 600)
B=${BUDGET:-300}      # at most this for the GPU sweeps (they take ~200 s on an H200)
start=$(date +%s)
work=$(mktemp -d)
mkdir -p "$work/gpu" "$work/gloo"
timeout $((B + 50)) python3 benchmarks/gpu/measure.py --out "$work/gpu" --budget-s $B $q 2>&1 | tee "$work/gpu/log.txt"
tar czf "$OUT/gpu.tgz" -C "$work" gpu   # the GPU data first, whatever happens after
left=$((TOTAL - ($(date +%s) - start) - 30))
if [ $left -gt 60 ]; then
  timeout $((left + 20)) python3 benchmarks/gpu/gloo_many_cores.py --out "$work/gloo" --budget-s $left $q \
    > "$work/gloo/log.txt" 2>&1
fi
tar czf "$OUT/gloo.tgz" -C "$work" gloo
tail -30 "$work/gloo/log.txt" 2>/dev/null
cp "$work/gpu/log.txt" "$OUT/log.txt"
ls -la "$OUT"
