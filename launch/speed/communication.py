"""Communication between GPUs: what each collective of a run moves per GPU per optimizer step, how long it takes, and
how much of it the compute does not hide.

What is counted, per strategy (`collectives`), from the run's own quantities (the memory model's `Architecture` and
`RunShape`: parameters, hidden and K/V widths, tokens per micro-batch, accumulation, precision):

- DDP: the gradients' bucketed all-reduce (25 MB buckets, torch DDP's `bucket_cap_mb`) in the reduce dtype (fp32
  under the recipes' fp32 masters, bf16 for a pure-bf16 run), during the backward of the last micro-batch only (the
  Trainer runs the others under `no_sync`); the last bucket has nothing left to hide behind.
- DeepSpeed ZeRO-1/2: the gradients' reduce-scatter (ZeRO-2 every micro-batch, ZeRO-1 at the accumulation boundary)
  and the post-step all-gather of the updated 16-bit parameters. Both exposed: DeepSpeed's `overlap_comm` defaults to
  on for stage 3 only (deepspeed/runtime/zero/config.py `overlap_comm_valid`), so stages 1 and 2 reduce on the
  compute stream.
- DeepSpeed ZeRO-3: each micro-batch all-gathers the 16-bit parameters (but the small ones kept whole on every rank)
  for the forward, again for checkpointing's recomputed forward (DeepSpeed's hooks gather per submodule and release
  after its forward), again for the backward, and reduce-scatters the gradients; prefetched, overlapped with the
  layers' compute.
- FSDP2 / FSDP1: per micro-batch a per-layer all-gather of the parameters in the mixed-precision param dtype for the
  forward, and for the backward when `reshard_after_forward` (the recomputed forward under checkpointing reuses the
  backward's gather: FSDP2's `_pre_forward` skips the unshard in PRE_BACKWARD); the gradients' reduce-scatter in the
  reduce dtype every micro-batch under `sync_each_batch` (or without accumulation), else on the last one. HSDP adds
  the sharded gradients' all-reduce across the dp_replicate replicas.
- Ulysses SP (DeepSpeed): 4 all-to-alls per layer in each forward (q, k, v, the attention output), 4 in the backward,
  over the SP group; nothing hides them (the attention waits for its inputs).
- Ring-attention CP (torch's `context_parallel`): per layer and pass, each rank's K and V chunks go round the CP group
  (cp - 1 steps: `allgather` gathers them, `alltoall` rotates them by send/recv), and the backward sends their
  gradients back too; overlapped with the attention kernel.

Bytes are those one GPU sends per collective by NCCL's ring conventions (nccl-tests, doc/PERFORMANCE.md): a buffer
of S bytes over n ranks moves 2 S (n - 1) / n for an all-reduce, S (n - 1) / n for an all-gather, a reduce-scatter
(S the whole, unsharded buffer) or an all-to-all, S for a send/recv. Divided by the link's bus bandwidth that is the
collective's time (the "busbw" nccl-tests reports is defined so that it compares with the link's speed).

Bus bandwidth (`Network`): within a node the GPU table's link (`launch.facts.gpus`, both directions together as the
data sheets state it), half of it per direction, at `INTRA_NODE_EFFICIENCY`; between nodes `--network-gbps` per GPU
(default 400 Gb/s, one 400G NIC per GPU as on H100 clusters) at `INTER_NODE_EFFICIENCY`. A group whose ranks span
nodes runs at the slower link (a ring through them). Ranks are laid out as Accelerate's DeviceMesh lays them out
(dp_replicate, dp_shard, cp, sp, tp, the last innermost), nodes holding consecutive ranks.

Overlap (`exposed`): a collective hidden behind compute runs in pieces (a layer, a bucket) each prefetched beside the
previous piece's compute (PyTorch FSDP paper, arXiv 2304.11277, sections 3.3-3.4: forward and backward prefetch,
reduce-scatter overlapped with the backward's compute), so over a window of compute C and communication M split into
u pieces the step waits max(0, M - C) + min(M, C) / u: whatever exceeds the compute, plus one piece that nothing hides
(the first gather, the last reduce-scatter, DDP's last bucket). The windows: the forward and the backward (the
backward including checkpointing's recomputed forward) of one micro-batch, split by FLOPs (a backward costs two
forwards), and the attention kernels for CP's exchange. What is hidden behind nothing (ZeRO-1/2, Ulysses) is exposed
whole. Not modelled: congestion and other jobs on the network, topology beyond one node vs between nodes (NVSwitch,
rails and switch tiers, SHARP), NCCL's protocol overheads and its tree algorithm (rings throughout), the contention of
two overlapped collectives for one link, and the slowdown compute kernels suffer from communication kernels sharing
the GPU's SMs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from launch.config.precision import BYTES
from launch.facts import gpus
from launch.memory import adapters
from launch.memory.architecture import Architecture
from launch.memory.run_shape import RunShape

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")
# Bytes one GPU sends per byte of the collective's (whole) buffer over n ranks: NCCL's ring conventions, nccl-tests
# doc/PERFORMANCE.md (busbw = algbw x this factor).
RING_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
               "reduce_scatter": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n,
               "send_recv": lambda n: 1.0}

DEFAULT_NETWORK_GBPS = 400.0  # per GPU between nodes: one 400 Gb/s NIC per GPU (InfiniBand NDR / 400G Ethernet)
# Share of the line rate NCCL's bus bandwidth reaches between nodes: nccl-tests' all_reduce_perf on InfiniBand reports
# about 90% of the NICs' rate at large messages (e.g. ~45 GB/s busbw per 400 Gb/s NIC). Not measured here.
INTER_NODE_EFFICIENCY = 0.9
# Share of the per-direction NVLink / PCIe rate NCCL's bus bandwidth reaches within a node: ~350 GB/s on an H100 SXM
# node (NVLink 4, 450 GB/s per direction), the figure nccl-tests' all_reduce_perf is commonly reported at on 8 H100
# SXM. Not measured here; carried to every GPU of the table as the same share of its link.
INTRA_NODE_EFFICIENCY = 350 / 450
DDP_BUCKET_BYTES = 25 * 2**20  # torch DistributedDataParallel's bucket_cap_mb default (25 MiB)
# Accelerate's DeviceMesh order, outermost first (accelerate/parallelism_config.py `_get_mesh`)
MESH_ORDER = ("dp_replicate", "dp_shard", "cp", "sp", "tp")


@dataclass(frozen=True)
class Network:
    """The bus bandwidths (bytes/s) a collective runs at: within a node, between nodes."""

    intra_node: float
    inter_node: float
    network_gbps: float

    @classmethod
    def of(cls, gpu: gpus.GPU | None = None, network_gbps: float = DEFAULT_NETWORK_GBPS) -> "Network":
        gpu = gpu or gpus.CALIBRATION
        return cls(gpu.link_bytes_per_s / 2 * INTRA_NODE_EFFICIENCY, network_gbps * 1e9 / 8 * INTER_NODE_EFFICIENCY,
                   network_gbps)

    def bus(self, inter_node: bool) -> float:
        """A group across nodes runs at the slower of the two links (a ring goes through both)."""
        return min(self.inter_node, self.intra_node) if inter_node else self.intra_node


@dataclass(frozen=True)
class Collective:
    """One collective of a step: `bytes` is what one GPU sends for it over the whole optimizer step (every call, by
    the ring conventions above), over a group of `group` ranks, within a node or across nodes (`inter_node`).
    `hidden_behind`: the compute it overlaps ("forward", "backward", "attention"), None when nothing hides it.
    `micro_batches`: in how many of the step's micro-batches it runs (all of them, or only the last / once per step);
    `pieces`: what each run is split into for the overlap (layers, buckets)."""

    name: str
    kind: str
    bytes: float
    group: int
    inter_node: bool
    hidden_behind: str | None
    micro_batches: int = 1
    pieces: int = 1

    def seconds(self, network: Network) -> float:
        return self.bytes / network.bus(self.inter_node)

    def as_json(self, network: Network, exposed_s: float) -> dict:
        return {"name": self.name, "kind": self.kind, "bytes": round(self.bytes), "group": self.group,
                "inter_node": self.inter_node, "hidden_behind": self.hidden_behind,
                "seconds": round(self.seconds(network), 4), "exposed_s": round(exposed_s, 4)}


def moved(kind: str, buffer_bytes: float, n: int) -> float:
    """Bytes one GPU sends for a collective of `kind` on a buffer of `buffer_bytes` over `n` ranks."""
    return buffer_bytes * RING_FACTOR[kind](n) if n > 1 else 0.0


def spans_nodes(run: RunShape, dims: tuple[str, ...]) -> bool:
    """Whether the group over mesh dimensions `dims` crosses nodes: the ranks from its outermost dimension inwards
    (Accelerate's mesh order, nodes holding consecutive ranks) are more than one node holds."""
    layout = run.layout
    if layout.num_machines <= 1:
        return False
    outer = min(MESH_ORDER.index(d) for d in dims)
    span = math.prod(int(layout.mesh.get(d, 1) or 1) for d in MESH_ORDER[outer:])
    return span > layout.processes_per_machine


def _gathered_bytes(arch: Architecture, run: RunShape) -> float:
    """Bytes of one whole copy of the parameters as a sharded strategy all-gathers them: FSDP's param dtype (the
    compute dtype under mixed precision), ZeRO-3's 16-bit copy less the small parameters it keeps whole on every rank;
    an adapter run's frozen base as stored (4-bit weights kept out of FSDP2's sharding are not gathered)."""
    a = BYTES.get(run.precision.compute_dtype, 4) if run.precision.mixed != "no" else run.precision.param_bytes
    if run.layout.sharding == "zero":
        a = 2 if run.precision.mixed in ("bf16", "fp16") else run.precision.param_bytes
        return a * (arch.num_params - arch.small_params + (adapters.trainable_params(arch, run)
                                                           if run.adapter is not None else 0))
    if run.adapter is None:
        return a * arch.num_params
    q = adapters.quantized_params(arch, run)
    frozen = adapters.frozen_bytes(arch, run)
    quant = q * run.adapter.quantization.bytes_per_weight if q and not frozen["unshardable"] else 0.0
    return a * (arch.num_params - q) + quant + a * adapters.trainable_params(arch, run)


def collectives(arch: Architecture, run: RunShape) -> list[Collective]:
    """Every collective of one optimizer step of `run` on one GPU (none on one process)."""
    layout = run.layout
    if layout.world_size <= 1 or run.device != "gpu":
        return []
    L, steps = arch.num_layers, layout.gradient_accumulation_steps
    P = adapters.trainable_params(arch, run)
    reduce_b = BYTES.get(run.precision.reduce_dtype, 4)
    out: list[Collective] = []
    if layout.sharding == "replicated":
        n = layout.dp_world_size
        if n > 1:
            buffer = P * reduce_b
            out.append(Collective("gradient all-reduce (DDP buckets)", "all_reduce", moved("all_reduce", buffer, n), n,
                                  spans_nodes(run, ("dp_replicate",)), "backward", 1,
                                  max(1, math.ceil(buffer / DDP_BUCKET_BYTES))))
    elif layout.sharding == "zero":
        n = layout.shard_group
        inter = spans_nodes(run, ("dp_replicate", "dp_shard", "cp", "sp"))
        if n > 1 and layout.zero_stage == 3:
            gathered = _gathered_bytes(arch, run)
            g = moved("all_gather", gathered, n)
            out.append(Collective("parameter all-gather (forward)", "all_gather", g * steps, n, inter, "forward",
                                  steps, L))
            if recomputed := run.checkpointed_layers(L):  # the checkpointed layers' (all, or the first k)
                out.append(Collective("parameter all-gather (recomputed forward)", "all_gather",
                                      g * steps * recomputed / L, n, inter, "backward", steps, recomputed))
            out.append(Collective("parameter all-gather (backward)", "all_gather", g * steps, n, inter, "backward",
                                  steps, L))
            out.append(Collective("gradient reduce-scatter", "reduce_scatter",
                                  moved("reduce_scatter", P * reduce_b, n) * steps, n, inter, "backward", steps, L))
        elif n > 1:
            times = steps if layout.zero_stage == 2 else 1
            out.append(Collective("gradient reduce-scatter", "reduce_scatter",
                                  moved("reduce_scatter", P * reduce_b, n) * times, n, inter, None, times))
            out.append(Collective("parameter all-gather (after the optimizer step)", "all_gather",
                                  moved("all_gather", P * run.precision.param_bytes, n), n, inter, None, 1))
    elif layout.sharding == "fsdp":
        n = layout.shard_group
        inter = spans_nodes(run, ("dp_shard", "cp"))
        if n > 1:
            g = moved("all_gather", _gathered_bytes(arch, run), n)
            out.append(Collective("parameter all-gather (forward)", "all_gather", g * steps, n, inter, "forward",
                                  steps, L))
            if run.fsdp_reshard_after_forward:
                out.append(Collective("parameter all-gather (backward)", "all_gather", g * steps, n, inter,
                                      "backward", steps, L))
            times = steps if (run.sync_each_batch or steps == 1) else 1
            out.append(Collective("gradient reduce-scatter", "reduce_scatter",
                                  moved("reduce_scatter", P * reduce_b, n) * times, n, inter, "backward", times, L))
        replicas = int(layout.mesh.get("dp_replicate", 1) or 1)
        if replicas > 1:
            times = steps if (run.sync_each_batch or steps == 1) else 1
            out.append(Collective("gradient all-reduce across replicas (HSDP)", "all_reduce",
                                  moved("all_reduce", P * reduce_b / max(n, 1), replicas) * times, replicas,
                                  spans_nodes(run, ("dp_replicate",)), "backward", times, L))
    T = layout.tokens_per_rank
    act = run.act_bytes
    fwd = 1 + run.checkpointed_layers(L) / L  # forward passes per layer, on average: checkpointed ones run twice
    if run.uses_ulysses and layout.sp > 1:
        n = layout.sp
        per_layer = T * (2 * arch.q_dim + 2 * arch.kv_dim) * act  # q, k, v in, the attention output back
        out.append(Collective(f"Ulysses all-to-all (4 per layer and pass, {fwd + 1:g} passes)", "all_to_all",
                              moved("all_to_all", per_layer, n) * L * (fwd + 1) * steps, n,
                              spans_nodes(run, ("sp",)), None, steps, L))
    if layout.cp > 1:
        n = layout.cp
        chunk = T * 2 * arch.kv_dim * act  # this rank's K and V
        kind = "all_gather" if run.cp_comm_strategy == "allgather" else "send_recv"
        # cp - 1 chunks in per layer and pass; the backward also returns the K/V gradients
        per_step = chunk * (n - 1) * L * (fwd + 2) * steps
        out.append(Collective("ring-attention K/V exchange", kind, per_step, n, spans_nodes(run, ("cp",)),
                              "attention", steps, L))
    return out


def exposed(found: list[Collective], windows: dict, steps: int, network: Network) -> dict:
    """Exposed seconds per collective (by name) over one optimizer step. `windows`: the compute seconds of one
    micro-batch each kind of collective can hide behind ("forward", "backward", "attention"). Per window and
    micro-batch the collectives running in it take M seconds against C of compute in u pieces: max(0, M - C) +
    min(M, C) / u exposed (module docstring), shared among them by their time; the collectives running in every
    micro-batch run in all `steps`, the others only in the last."""
    out = {c.name: 0.0 for c in found}
    for c in found:
        if c.hidden_behind is None:
            out[c.name] = c.seconds(network)
    for window in {c.hidden_behind for c in found if c.hidden_behind}:
        members = [c for c in found if c.hidden_behind == window]
        compute = windows.get(window, 0.0)
        for last in (False, True):
            running = [c for c in members if last or c.micro_batches == steps]
            times = 1 if last else steps - 1
            if not running or not times:
                continue
            per = {c.name: c.seconds(network) / c.micro_batches for c in running}
            m = sum(per.values())
            if m <= 0:
                continue
            pieces = max(c.pieces for c in running)
            wait = max(0.0, m - compute) + min(m, compute) / pieces
            for c in running:
                out[c.name] += times * wait * per[c.name] / m
    return out


@dataclass(frozen=True)
class Communication:
    """A run's collectives on a network, and what of them the step waits for."""

    collectives: tuple[Collective, ...]
    exposed_s: dict  # name -> exposed seconds per optimizer step
    network: Network

    @property
    def exposed(self) -> float:
        return sum(self.exposed_s.values())

    @property
    def total(self) -> float:
        return sum(c.seconds(self.network) for c in self.collectives)

    @property
    def bytes(self) -> float:
        return sum(c.bytes for c in self.collectives)

    def as_json(self) -> list:
        return [c.as_json(self.network, self.exposed_s[c.name]) for c in self.collectives]


def communication(arch: Architecture, run: RunShape, windows: dict, network: Network) -> Communication:
    found = collectives(arch, run)
    return Communication(tuple(found), exposed(found, windows, run.layout.gradient_accumulation_steps, network),
                         network)


# Communication-bound: the collectives take longer than the compute they could hide behind (no overlap can hide them
# all), or what the step waits for is this share of it or more.
BOUND_SHARE = 0.15


def bound(compute_s: float, comm: Communication) -> bool:
    step = compute_s + comm.exposed
    return bool(comm.collectives) and (comm.total > compute_s or comm.exposed >= BOUND_SHARE * step)


def check_network_gbps(value: float) -> float:
    """`--network-gbps`: a positive finite number (NaN and infinities refused), else a ValueError."""
    if not 0 < value < math.inf:
        raise ValueError(f"--network-gbps {value:g}: give the network's rate per GPU between nodes in Gb/s, a "
                         f"positive finite number (default {DEFAULT_NETWORK_GBPS:g}).")
    return value


def describe(compute_s: float, found: Communication | None, world: int, nodes: int, tokens_per_step: int) -> str:
    """The short block `plan` prints after its memory table: compute, exposed communication and the step per GPU,
    the collectives by size, and when communication-bound, what would change it."""
    if not found or not found.collectives:
        return (f"Speed (predicted per GPU, launch/speed/model.py): compute {compute_s:.3f} s per step "
                f"({tokens_per_step:,} tokens per GPU); "
                + ("no communication between GPUs (one process)." if world <= 1 else
                   "no collectives modelled for this run on this device."))
    net = found.network
    step = compute_s + found.exposed
    lines = [f"Speed (predicted per GPU of {world} on {nodes} node(s), launch/speed/model.py and communication.py; bus "
             f"bandwidth {net.intra_node / 1e9:,.0f} GB/s within a node, {net.inter_node / 1e9:,.0f} GB/s between "
             f"nodes at {net.network_gbps:g} Gb/s):",
             f"  compute {compute_s:.3f} s + exposed communication {found.exposed:.3f} s = step {step:.3f} s; "
             f"collectives {found.bytes / 1e9:,.1f} GB per GPU per step, {found.total:.3f} s at bus bandwidth"]
    for c in sorted(found.collectives, key=lambda c: -c.bytes):
        lines.append(f"  {c.name:<52} {c.bytes / 1e9:>8,.2f} GB over {c.group:>3} ranks "
                     f"{'between nodes' if c.inter_node else 'within a node':<13}  {c.seconds(net):7.3f} s, "
                     f"exposed {found.exposed_s[c.name]:7.3f} s"
                     + (f" (behind the {c.hidden_behind})" if c.hidden_behind else " (nothing hides it)"))
    if bound(compute_s, found):
        lines.append(
            f"Communication-bound: the collectives take {found.total:.2f} s against {compute_s:.2f} s of compute "
            f"({found.exposed / step:.0%} of the step waits for them; bound: more than the compute, or "
            f"{BOUND_SHARE:.0%} of the step or more). What would change it: a larger micro-batch (more compute per "
            "gather and reduce-scatter: the same bytes per micro-batch)"
            + (", HSDP (shard within a node, replicate across nodes: the gathers stay on the node's links)"
               if any(c.inter_node and c.kind == "all_gather" and c.hidden_behind for c in found.collectives)
               else "")
            + (f", a faster network (--network-gbps, now {net.network_gbps:g})"
               if any(c.inter_node for c in found.collectives) else "") + ".")
    return "\n".join(lines)
