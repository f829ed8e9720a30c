"""Whether a GGUF model fits in memory once dequantised, checked before any loading starts."""

from __future__ import annotations

from pathlib import Path

FLOAT32_BYTES = 4


def float32_bytes(gguf_path: str | Path) -> int:
    """Bytes the weights take once transformers dequantises them to float32 (from the header's tensor shapes)."""
    from gguf import GGUFReader

    reader = GGUFReader(str(gguf_path))
    return FLOAT32_BYTES * sum(int(tensor.n_elements) for tensor in reader.tensors)


def available_bytes() -> int | None:
    """Memory available to a new process (psutil, else /proc/meminfo's MemAvailable); None when neither says."""
    try:
        import psutil
    except ImportError:
        psutil = None
    if psutil is not None:
        return int(psutil.virtual_memory().available)
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def saved_bytes(folder: str | Path) -> int:
    """Bytes of the weights saved as safetensors in `folder` (a dequantised copy: float32, so its size on disk)."""
    return sum(path.stat().st_size for path in Path(folder).glob("*.safetensors"))


def check_fits(gguf_path: str | Path, available: int | None = None, needed: int | None = None) -> None:
    """Raise a MemoryError naming both sizes when the float32 weights of `gguf_path` (`needed` bytes when known, e.g.
    from its dequantised copy; else read from the GGUF header, which parses its whole vocabulary) exceed the available
    memory."""
    available = available_bytes() if available is None else available
    if available is None:
        return  # this platform does not say; loading will tell
    needed = float32_bytes(gguf_path) if needed is None else needed
    if needed > available:
        raise MemoryError(
            f"{Path(gguf_path).name} needs about {needed / 2**30:.1f} GiB once dequantised to float32, and only "
            f"{available / 2**30:.1f} GiB of memory is available; free memory (stop other model processes) or use a "
            f"machine with more"
        )
