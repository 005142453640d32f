"""What the memory model answers: a `Term` per line of the table and the `Estimate` that holds them."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Term:
    name: str
    gib: float
    setting: str  # the config setting that controls it
    where: str  # "gpu" or "host"
    counted: bool = True  # part of the peak (False: another phase's term, shown for information)


@dataclass
class Estimate:
    gpu_terms: list[Term]
    host_terms: list[Term]
    gpu_peak_gib: float  # per GPU (CPU mode: peak resident set of one process)
    host_per_process_gib: float
    host_per_node_gib: float
    per_rank_length: int
    allocated_peak_gib: float = 0.0  # what torch.cuda.max_memory_allocated would report (no context / reserve)
    peak_phase: str = ""
    device: str = "gpu"
    notes: list[str] = field(default_factory=list)

    def largest_gpu_term(self) -> Term:
        counted = [t for t in self.gpu_terms if t.counted and t.gib > 0]
        return max(counted or self.gpu_terms, key=lambda t: t.gib)

    def largest_host_term(self) -> Term | None:
        counted = [t for t in self.host_terms if t.counted and t.gib > 0]
        return max(counted, key=lambda t: t.gib) if counted else None

    def advice(self, gpu_memory_gib: float | None = None, host_memory_gib: float | None = None) -> str:
        """The largest term of what does not fit and the setting that would shrink it, one sentence each: the GPU's
        (also when no budget is given), the host's when the node's host memory is over its budget."""
        host_over = host_memory_gib is not None and self.host_per_node_gib > host_memory_gib
        gpu_over = gpu_memory_gib is None or self.gpu_peak_gib > gpu_memory_gib or not host_over
        out = []
        if gpu_over:
            t = self.largest_gpu_term()
            out.append(f"The largest term is {t.name} ({t.gib:.1f} GiB); to shrink it, change {t.setting}.")
        if host_over and (t := self.largest_host_term()):
            out.append(f"The largest host-memory term is {t.name} ({t.gib:.1f} GiB per process); to shrink it, change "
                       f"{t.setting}.")
        return " ".join(out)
