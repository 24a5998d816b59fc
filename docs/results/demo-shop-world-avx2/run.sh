#!/bin/bash
# the current demo (make demo's command) with torch's AVX-512 / AMX paths switched off: AVX2 kernels, bf16 probe -> float32
cd /work/exp
export ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 OMP_WAIT_POLICY=PASSIVE
date -u
/usr/bin/time -v .venv/bin/envace demo --out runs/demo-avx2-emul
echo "rc=$?"
date -u
