"""Which float precision to train in: bf16 autocast only where the hardware computes bf16 natively.

bf16 autocast on a CPU with AVX-512 BF16 or AMX trains the tiny model about 2.4x faster than fp32;
on a CPU without them (AVX2 only, e.g. AMD Zen 3) PyTorch emulates bf16 and the same step runs about
15x slower than fp32. `auto` picks bf16 only when the CPU has the instructions and the libraries may
use them: ATen's dispatch level (ATEN_CPU_CAPABILITY) and oneDNN's (ONEDNN_MAX_CPU_ISA) can be capped
below what /proc/cpuinfo lists, and a capped library emulates bf16 as slowly as an old CPU.
"""

from __future__ import annotations

import os
from contextlib import nullcontext
from typing import Literal

import torch

Precision = Literal["auto", "bf16", "fp32"]

_ONEDNN_BELOW_BF16 = {"sse41", "avx", "avx2", "avx2_vnni", "avx2_vnni_2", "avx512_core", "avx512_core_vnni"}


def native_bf16(device: str = "cpu") -> tuple[bool, str]:
    """(whether bf16 runs natively here, the reason in words)."""
    if device == "cuda":
        ok = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        return ok, "CUDA device with bf16" if ok else "CUDA device without bf16"
    flags = [
        name
        for name, has in (
            ("avx512_bf16", torch.cpu._is_avx512_bf16_supported()),
            ("amx_bf16", torch.cpu._is_amx_tile_supported()),
        )
        if has
    ]
    if not flags:
        return False, "the CPU has neither AVX-512 BF16 nor AMX"
    capability = torch.backends.cpu.get_cpu_capability()
    if not capability.startswith("AVX512"):
        return False, f"ATen runs at {capability} (ATEN_CPU_CAPABILITY caps it below AVX-512)"
    onednn = os.environ.get("ONEDNN_MAX_CPU_ISA", "").lower()
    if onednn in _ONEDNN_BELOW_BF16:
        return False, f"ONEDNN_MAX_CPU_ISA={onednn} keeps oneDNN below its bf16 instructions"
    return True, f"the CPU has {' and '.join(flags)}"


def resolve(precision: Precision, device: str = "cpu") -> tuple[Literal["bf16", "fp32"], str]:
    """The precision to use and a line saying why (logged when training starts)."""
    if precision != "auto":
        return precision, f"precision {precision} (as configured)"
    native, why = native_bf16(device)
    return ("bf16" if native else "fp32"), f"precision {'bf16' if native else 'fp32'} (auto: {why})"


def autocast(precision: Literal["bf16", "fp32"], device: str = "cpu"):
    """bf16 autocast, or nothing for fp32."""
    return torch.autocast(device, dtype=torch.bfloat16) if precision == "bf16" else nullcontext()
