#!/usr/bin/env bash
# One call on the device machine: the GPU sweeps (benchmarks/gpu/measure.py, pinned to cores 0-3)
# and the 4/8-rank gloo validation (benchmarks/gpu/gloo_many_cores.py, cores 4-15) side by side.
# Writes $OUT/gpu.tgz, $OUT/gloo.tgz and $OUT/log.txt.   QUICK=1: the CPU smoke version.
set -u
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then  # simpy is not on the device image: carried as a wheel
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONPATH=${PYTHONPATH:-$PWD}
pin() { if command -v taskset >/dev/null && taskset -c "$1" true 2>/dev/null; then taskset -c "$1" "${@:2}"; else "${@:2}"; fi; }
q=${QUICK:+--quick}
B=${BUDGET:-440}
work=$(mktemp -d)
mkdir -p "$work/gpu" "$work/gloo"
( pin 4-15 timeout $((B + 60)) python3 benchmarks/gpu/gloo_many_cores.py --out "$work/gloo" --budget-s $((B + 10)) $q \
    > "$work/gloo/log.txt" 2>&1 ) &
pin 0-3 timeout $((B + 50)) python3 benchmarks/gpu/measure.py --out "$work/gpu" --budget-s $B $q 2>&1 | tee "$work/gpu/log.txt"
wait
tar czf "$OUT/gpu.tgz" -C "$work" gpu
tar czf "$OUT/gloo.tgz" -C "$work" gloo
tail -40 "$work/gloo/log.txt"
cp "$work/gpu/log.txt" "$OUT/log.txt"
ls -la "$OUT"
