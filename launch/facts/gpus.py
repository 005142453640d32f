"""GPU models' published figures, one row per model (`GPUS`): memory (the marketed GB and the GiB torch reports),
the dense (no sparsity) BF16 tensor-core peak -- the denominator of every MFU the launcher reports
(`launch.speed.measured`) or predicts (`launch.speed.model`) --, the memory bandwidth, the link between the GPUs of a
node and the host link, each row with its public source (the vendor's data sheet) beside it; and the GPU the measured
constants of `launch.facts.calibration` come from. The one owner of these figures: every peak and every GPU memory the
launcher uses is read here (`detect` from torch's device name, `lookup` from a user's `--gpu NAME`).

Pure data, nothing imported from the launcher. A new GPU is one row of `GPUS`, with its source.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

# What the H100 SXM 80GB of the calibration run reports (torch.cuda.get_device_properties(0).total_memory, GiB).
H100_80GB_TORCH_GIB = 79.1


def torch_gib(gb: float, gddr_ecc: bool = False) -> float:
    """The GiB torch reports for a GPU marketed as `gb` GB, by a stated rule: the marketed size is the DRAM in GiB
    (HBM stacks and GDDR chips come in binary sizes: an "80 GB" H100 has 80 GiB), of which the driver keeps what it
    kept on the calibration H100 (79.1 of 80 GiB, 1.1%); a GDDR board with ECC on (the data-center L4, A10G, L40S
    ship with it on) also loses the ECC's 1/16 (NVIDIA's ECC for GDDR6 stores its check bits in the same memory).
    Within about 1% of what torch reports on the boards we know (L4 22.0, A100 40GB 39.4, RTX 4090 23.6 GiB)."""
    return round(gb * H100_80GB_TORCH_GIB / 80 * (15 / 16 if gddr_ecc else 1), 1)


@dataclass(frozen=True)
class GPU:
    name: str  # the table's name, what `--gpu` takes (case-insensitive)
    matches: tuple[tuple[str, ...], ...]  # torch's device name holds every word of one of these (case-insensitive)
    memory_gb: float  # as marketed (the data sheet)
    memory_gib: float  # as torch reports it (`torch_gib`, or measured)
    memory: str  # its kind: HBM3, GDDR6 ...
    peak_bf16: float  # dense BF16 tensor-core peak, FLOP/s (the data sheets' sparse figure / 2)
    memory_bytes_per_s: float  # the memory bandwidth of the data sheet
    link: str  # between the GPUs of a node
    link_bytes_per_s: float  # per GPU, both directions together, as the data sheets state it
    host_link_bytes_per_s: float  # to the host, per direction (PCIe Gen4 x16 32 GB/s, Gen5 x16 64 GB/s)
    source: str  # the vendor's data sheet
    aliases: tuple[str, ...] = ()  # other names `--gpu` takes

    def as_json(self) -> dict:
        return {"name": self.name, "memory_gb": self.memory_gb, "memory_gib": self.memory_gib, "memory": self.memory,
                "peak_bf16_tflops": round(self.peak_bf16 / 1e12, 1),
                "memory_bandwidth_tb_s": round(self.memory_bytes_per_s / 1e12, 3), "link": self.link,
                "link_gb_s": round(self.link_bytes_per_s / 1e9), "source": self.source}

    def describe(self) -> str:
        """One line: "H100 SXM (80 GB HBM3, 79.1 GiB as torch reports it; ...)"."""
        return (f"{self.name} ({self.memory_gb:g} GB {self.memory}, {self.memory_gib:g} GiB as torch reports it; "
                f"dense BF16 peak {self.peak_bf16 / 1e12:,.0f} TFLOP/s; memory {self.memory_bytes_per_s / 1e12:.2f} "
                f"TB/s; {self.link} {self.link_bytes_per_s / 1e9:,.0f} GB/s per GPU)")


PCIE4, PCIE5 = 32e9, 64e9  # x16, per direction

# Most specific first: `detect` takes the first row whose words torch's device name holds.
GPUS = (
    # NVIDIA H100 data sheet (https://www.nvidia.com/en-us/data-center/h100/), H100 NVL column: 94 GB HBM3, 3.9 TB/s,
    # BF16 1,671 TFLOPS sparse, NVLink bridge 600 GB/s, PCIe Gen5
    GPU("H100 NVL", (("H100", "NVL"),), 94, torch_gib(94), "HBM3", 835e12, 3.9e12, "NVLink bridge", 600e9, PCIE5,
        "https://www.nvidia.com/en-us/data-center/h100/"),
    # NVIDIA H100 data sheet, H100 PCIe column: 80 GB HBM2e, 2.0 TB/s, BF16 1,513 TFLOPS sparse, PCIe Gen5 128 GB/s
    # (an optional NVLink bridge: 600 GB/s)
    GPU("H100 PCIe", (("H100", "PCIE"),), 80, H100_80GB_TORCH_GIB, "HBM2e", 756e12, 2.0e12, "PCIe Gen5", 128e9,
        PCIE5, "https://www.nvidia.com/en-us/data-center/h100/"),
    # NVIDIA H100 data sheet, H100 SXM column: 80 GB HBM3, 3.35 TB/s, BF16 1,979 TFLOPS sparse, NVLink 4 900 GB/s.
    # torch calls it "NVIDIA H100 80GB HBM3"; the calibration GPU (its memory measured: 79.1 GiB)
    GPU("H100 SXM", (("H100",),), 80, H100_80GB_TORCH_GIB, "HBM3", 989e12, 3.35e12, "NVLink 4", 900e9, PCIE5,
        "https://www.nvidia.com/en-us/data-center/h100/", aliases=("H100",)),
    # NVIDIA H800 SXM: the H100 SXM's tensor cores and memory, NVLink cut to 400 GB/s (NVIDIA H800 product brief)
    GPU("H800", (("H800",),), 80, H100_80GB_TORCH_GIB, "HBM3", 989e12, 3.35e12, "NVLink 4", 400e9, PCIE5,
        "https://www.nvidia.com/en-us/data-center/h800/"),
    # NVIDIA GH200 Grace Hopper data sheet: 96 GB HBM3, 4 TB/s, BF16 1,979 TFLOPS sparse, NVLink-C2C 900 GB/s to
    # the Grace CPU
    GPU("GH200", (("GH200",),), 96, torch_gib(96), "HBM3", 989e12, 4.0e12, "NVLink 4", 900e9, 450e9,
        "https://www.nvidia.com/en-us/data-center/grace-hopper-superchip/"),
    # NVIDIA H200 data sheet (https://www.nvidia.com/en-us/data-center/h200/), H200 SXM: 141 GB HBM3e, 4.8 TB/s,
    # BF16 1,979 TFLOPS sparse, NVLink 4 900 GB/s, PCIe Gen5
    GPU("H200", (("H200",),), 141, torch_gib(141), "HBM3e", 989e12, 4.8e12, "NVLink 4", 900e9, PCIE5,
        "https://www.nvidia.com/en-us/data-center/h200/"),
    # NVIDIA HGX B200 (https://www.nvidia.com/en-us/data-center/hgx/), per GPU of 8: 180 GB HBM3e (1.44 TB), 8 TB/s
    # (64 TB/s), FP16/BF16 36 PFLOPS sparse (4.5 per GPU), NVLink 5 1.8 TB/s, PCIe Gen5
    GPU("B200", (("B200",),), 180, torch_gib(180), "HBM3e", 2250e12, 8.0e12, "NVLink 5", 1800e9, PCIE5,
        "https://www.nvidia.com/en-us/data-center/hgx/"),
    # NVIDIA A100 data sheet (https://www.nvidia.com/en-us/data-center/a100/): BF16 624 TFLOPS sparse; 40GB: HBM2,
    # 1,555 GB/s; 80GB SXM: HBM2e, 2,039 GB/s (PCIe 1,935); NVLink 3 600 GB/s, PCIe Gen4. torch: "NVIDIA
    # A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB", "NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe"
    GPU("A100 40GB", (("A100", "40GB"),), 40, torch_gib(40), "HBM2", 312e12, 1.555e12, "NVLink 3", 600e9, PCIE4,
        "https://www.nvidia.com/en-us/data-center/a100/"),
    GPU("A100 80GB", (("A100",),), 80, torch_gib(80), "HBM2e", 312e12, 2.039e12, "NVLink 3", 600e9, PCIE4,
        "https://www.nvidia.com/en-us/data-center/a100/"),
    # A800: the A100's tensor cores, NVLink cut to 400 GB/s (NVIDIA A800 product brief)
    GPU("A800", (("A800",),), 80, torch_gib(80), "HBM2e", 312e12, 2.039e12, "NVLink 3", 400e9, PCIE4,
        "https://www.nvidia.com/en-us/data-center/a800/"),
    # NVIDIA L40S data sheet (https://www.nvidia.com/en-us/data-center/l40s/): 48 GB GDDR6 with ECC, 864 GB/s, BF16
    # 733 TFLOPS sparse (362.05 dense), PCIe Gen4 x16 64 GB/s both directions, no NVLink
    GPU("L40S", (("L40S",),), 48, torch_gib(48, gddr_ecc=True), "GDDR6", 362e12, 864e9, "PCIe Gen4", 64e9, PCIE4,
        "https://www.nvidia.com/en-us/data-center/l40s/"),
    # NVIDIA L40 data sheet (https://www.nvidia.com/en-us/data-center/l40/): BF16 362 TFLOPS sparse, 864 GB/s
    GPU("L40", (("L40",),), 48, torch_gib(48, gddr_ecc=True), "GDDR6", 181e12, 864e9, "PCIe Gen4", 64e9, PCIE4,
        "https://www.nvidia.com/en-us/data-center/l40/"),
    # NVIDIA L4 data sheet (https://www.nvidia.com/en-us/data-center/l4/): 24 GB GDDR6, 300 GB/s, BF16 242 TFLOPS
    # sparse, PCIe Gen4 x16 64 GB/s
    GPU("L4", (("L4",),), 24, torch_gib(24, gddr_ecc=True), "GDDR6", 121e12, 300e9, "PCIe Gen4", 64e9, PCIE4,
        "https://www.nvidia.com/en-us/data-center/l4/"),
    # AWS's A10G, of EC2 G5 instances (https://aws.amazon.com/ec2/instance-types/g5/): 24 GB GDDR6, 600 GB/s (the
    # A10's memory: https://www.nvidia.com/en-us/data-center/products/a10-gpu/); its tensor peak is AWS's, 70 TFLOPS
    GPU("A10G", (("A10G",),), 24, torch_gib(24, gddr_ecc=True), "GDDR6", 70e12, 600e9, "PCIe Gen4", 64e9, PCIE4,
        "https://aws.amazon.com/ec2/instance-types/g5/"),
    # NVIDIA A10 data sheet (https://www.nvidia.com/en-us/data-center/products/a10-gpu/): 24 GB GDDR6, 600 GB/s, BF16
    # 250 TFLOPS sparse
    GPU("A10", (("A10",),), 24, torch_gib(24, gddr_ecc=True), "GDDR6", 125e12, 600e9, "PCIe Gen4", 64e9, PCIE4,
        "https://www.nvidia.com/en-us/data-center/products/a10-gpu/"),
    # NVIDIA Ada Lovelace architecture whitepaper (https://images.nvidia.com/aem-dam/Solutions/geforce/ada/
    # nvidia-ada-gpu-architecture.pdf), GeForce RTX 4090: 24 GB GDDR6X, 1,008 GB/s, BF16 with FP32 accumulate (what
    # training runs) 165.2 TFLOPS dense (330.3 sparse; the FP16-accumulate figure is twice that), PCIe Gen4, no NVLink
    GPU("RTX 4090", (("4090",),), 24, torch_gib(24), "GDDR6X", 165.2e12, 1008e9, "PCIe Gen4", 64e9, PCIE4,
        "https://www.nvidia.com/en-us/geforce/graphics-cards/40-series/rtx-4090/", aliases=("4090",)),
)

# Each row's compute capability (NVIDIA's list, https://developer.nvidia.com/cuda-gpus: Hopper 9.0, Blackwell B200 10.0,
# A100 / A800 8.0, A10 / A10G 8.6, Ada (L4, L40, L40S, RTX 4090) 8.9): what decides which attention kernels torch runs
# on it (launch.speed.model.masked_sdpa_backend).
COMPUTE_CAPABILITY = {"H100 NVL": (9, 0), "H100 PCIe": (9, 0), "H100 SXM": (9, 0), "H800": (9, 0), "GH200": (9, 0),
                      "H200": (9, 0), "B200": (10, 0), "A100 40GB": (8, 0), "A100 80GB": (8, 0), "A800": (8, 0),
                      "L40S": (8, 9), "L40": (8, 9), "L4": (8, 9), "A10G": (8, 6), "A10": (8, 6), "RTX 4090": (8, 9)}

# The GPU every measured constant of launch.facts.calibration was measured on (an H100 SXM, 80GB HBM3); a plan without
# `--gpu` targets it.
CALIBRATION_GPU = "H100 SXM"


def _words(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", " ", text.lower()).strip()


def detect(device_name: str | None) -> GPU | None:
    """The row of the GPU torch calls `device_name` (torch.cuda.get_device_name(): "NVIDIA H100 80GB HBM3"); None for
    a GPU not in the table, a CPU or no name."""
    if not device_name:
        return None
    name = device_name.upper()
    return next((gpu for gpu in GPUS if any(all(w in name for w in words) for words in gpu.matches)), None)


def peak_bf16(name: str | None) -> float | None:
    """The dense BF16 peak of the GPU torch calls `name` (torch.cuda.get_device_name()); None for a GPU not in the
    table, a CPU or no name."""
    gpu = detect(name)
    return gpu.peak_bf16 if gpu else None


def lookup(name: str) -> GPU:
    """The row `--gpu NAME` names: its table name or an alias, case-insensitive, spaces, dashes and underscores alike
    ("h100-sxm", "a100 40gb"), or torch's own device name ("NVIDIA A100-SXM4-40GB"). A ValueError saying which rows
    come close otherwise."""
    wanted = _words(name).replace(" ", "")
    for gpu in GPUS:
        if wanted in {_words(n).replace(" ", "") for n in (gpu.name, *gpu.aliases)}:
            return gpu
    if (gpu := detect(name)) and _words(name).startswith("nvidia"):
        return gpu
    names = [gpu.name for gpu in GPUS]
    close = difflib.get_close_matches(_words(name), [_words(n) for n in names], n=3, cutoff=0.5)
    near = list(dict.fromkeys([n for n in names if wanted and wanted in _words(n).replace(" ", "")]
                              + [n for c in close for n in names if _words(n) == c]))
    hint = f"Did you mean {', '.join(near)}? " if near else ""
    raise ValueError(f"--gpu {name}: not a GPU of the table (launch/facts/gpus.py). {hint}Known: {', '.join(names)}.")


def by_name(name: str) -> GPU:
    """The row named `name` exactly."""
    return next(gpu for gpu in GPUS if gpu.name == name)


CALIBRATION = by_name(CALIBRATION_GPU)
CALIBRATION_PEAK = CALIBRATION.peak_bf16
