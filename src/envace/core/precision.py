"""bf16 only where it is fast.

On a CPU with AVX-512-BF16 (or AMX) a bf16 matmul is 2-4x faster than a float32 one; on a CPU without bf16 units
(AVX2 only) torch falls back to a scalar kernel that is ~50x *slower* (512x576 @ 576x1536: 837 ms vs 17 ms), so a
bf16 default there turns minutes into hours. Every bf16 setting of envace (``SFTConfig.bf16``, ``TrainConfig.bf16``
/ ``rollout_bf16``, ``HFBackend(bf16=)``, ``envace eval|serve --bf16``) therefore takes ``True``, ``False`` or
``"auto"`` and goes through :func:`resolve_bf16`:

- ``"auto"`` (or ``None``): bf16 where it is fast. On CPU a tiny timed matmul decides (:func:`probe_cpu_bf16`,
  run once per process, a few ms where bf16 is fast); on CUDA ``torch.cuda.is_bf16_supported()``; float32
  elsewhere.
- ``True``: bf16, as asked, with a one-line warning where bf16 is slow.
- ``False``: float32.

:func:`use_bf16` applies the decision and prints its note (fallback or warning) once per process.
"""

from __future__ import annotations

import functools
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:  # importing this module (config.py does) does not import torch
    import torch

AUTO = "auto"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def bf16_setting(value: Any, where: str = "bf16") -> bool | str:
    """A bf16 setting normalised to ``True``, ``False`` or ``"auto"`` (``None`` is ``"auto"``; strings such as
    ``"on"`` / ``"off"`` are booleans); anything else is a ValueError that names ``where``."""
    if value is None or isinstance(value, bool):
        return AUTO if value is None else value
    if isinstance(value, str):
        v = value.strip().lower()
        if v == AUTO:
            return AUTO
        if v in _TRUE or v in _FALSE:
            return v in _TRUE
    raise ValueError(
        f"{where}: bad value {value!r}: expected true, false or 'auto' (bf16 where it is faster than float32)"
    )


@dataclass(frozen=True)
class Bf16Probe:
    """One timing of the same matmul in bf16 and float32 on this CPU (best of a few runs, milliseconds)."""

    bf16_ms: float
    float32_ms: float
    capability: str
    """What torch reports (``torch.backends.cpu.get_cpu_capability()``: DEFAULT, AVX2, AVX512, ...)."""

    @property
    def fast(self) -> bool:
        """bf16 pays: its matmul is faster than the float32 one."""
        return self.bf16_ms < self.float32_ms

    def describe(self) -> str:
        return f"probe: {self.bf16_ms:.2f} ms vs {self.float32_ms:.2f} ms, torch CPU capability {self.capability}"


def probe_cpu_bf16(rows: int = 64, inner: int = 576, cols: int = 1536, repeats: int = 3) -> Bf16Probe:
    """Time ``(rows, inner) @ (inner, cols)`` in bf16 and float32 (the shape of a small model's decode step): one
    warm-up each, then the best of ``repeats`` interleaved runs, stopping early once bf16 is clearly (4x) slower,
    so that a CPU with a scalar bf16 kernel spends ~0.1 s here and not more."""
    import torch

    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(rows, inner, generator=g), torch.randn(inner, cols, generator=g)
    pairs = {torch.float32: (a, b), torch.bfloat16: (a.bfloat16(), b.bfloat16())}
    best = {dt: float("inf") for dt in pairs}
    with torch.inference_mode():
        for x, y in pairs.values():
            x @ y  # warm-up: kernel selection, first-touch allocations
        for _ in range(repeats):
            for dt, (x, y) in pairs.items():
                t0 = time.perf_counter()
                x @ y
                best[dt] = min(best[dt], (time.perf_counter() - t0) * 1e3)
            if best[torch.bfloat16] > 4 * best[torch.float32]:
                break
    return Bf16Probe(
        bf16_ms=best[torch.bfloat16], float32_ms=best[torch.float32], capability=torch.backends.cpu.get_cpu_capability()
    )


@functools.lru_cache(maxsize=None)
def cpu_bf16_probe() -> Bf16Probe:
    """:func:`probe_cpu_bf16`, run once per process."""
    return probe_cpu_bf16()


def cuda_bf16_supported() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.is_bf16_supported()


def resolve_bf16(
    requested: bool | str | None,
    device: str | torch.device = "cpu",
    probe: Callable[[], Bf16Probe] | None = None,
    cuda_bf16: Callable[[], bool] | None = None,
) -> tuple[bool, str | None]:
    """(use bf16?, a one-line note or None) for a bf16 setting on ``device``; pure given ``probe`` / ``cuda_bf16``
    (injectable, so the rule can be checked without this machine's CPU; None: :func:`cpu_bf16_probe`,
    :func:`cuda_bf16_supported`). The probe runs only for ``True`` or ``"auto"`` on CPU."""
    want = bf16_setting(requested)
    probe, cuda_bf16 = probe or cpu_bf16_probe, cuda_bf16 or cuda_bf16_supported
    if want is False:
        return False, None
    kind = str(device).split(":")[0]  # cpu, cuda, mps, ... (a str or a torch.device)
    if kind == "cpu":
        p = probe()
        if p.fast:
            return True, None
        if want is True:
            return True, f"bf16 is slower than float32 on this CPU ({p.describe()}); using bf16 as requested"
        return False, f"bf16 is slower than float32 on this CPU ({p.describe()}); using float32"
    if kind == "cuda":
        if cuda_bf16():
            return True, None
        if want is True:
            return (
                True,
                "this GPU does not support bf16 (torch.cuda.is_bf16_supported() is False); using bf16 as requested",
            )
        return False, "this GPU does not support bf16; using float32"
    if want is True:
        return True, None
    return False, f"bf16 'auto' on a {kind} device: using float32"


_said: set[str] = set()


def use_bf16(
    requested: bool | str | None, device: str | torch.device = "cpu", probe: Callable[[], Bf16Probe] | None = None
) -> bool:
    """:func:`resolve_bf16`'s decision; its note goes to stderr once per process (the same note is not repeated)."""
    use, note = resolve_bf16(requested, device, probe)
    if note and note not in _said:
        _said.add(note)
        print(f"envace: {note}", file=sys.stderr, flush=True)
    return use


def cpu_model_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``, else :func:`platform.processor`), for result files."""
    import platform

    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def hardware_summary() -> dict[str, Any]:
    """What a result was measured on: CPU model, cores, torch's CPU capability, and what bf16 ``auto`` decides
    here (with the probe's timings), so every stored number says which kind of CPU it came from."""
    import os

    p = cpu_bf16_probe()
    return {
        "cpu": cpu_model_name(),
        "cores": os.cpu_count(),
        "torch_cpu_capability": p.capability,
        "bf16_decision": ("bf16" if p.fast else "float32") + f" ({p.describe()})",
    }
