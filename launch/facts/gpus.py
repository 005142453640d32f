"""GPU models' published figures, one row per model: the dense (no sparsity) BF16 tensor-core peak, the denominator of
every MFU the launcher reports (`launch.speed.measured`) or predicts (`launch.speed.model`), and the GPU the measured
constants of `launch.facts.calibration` come from.

Pure data, nothing imported. A new GPU is one row of `PEAK_BF16`, with its public source beside it.
"""

from __future__ import annotations

# Dense BF16 tensor-core peak, FLOP/s, by a name torch.cuda.get_device_name() contains. Matched by substring, first
# match wins, so the more specific names come first. NVIDIA's data sheets give the peak with 2:4 sparsity; the dense
# peak is half of it.
PEAK_BF16 = {
    # NVIDIA H100 data sheet (https://www.nvidia.com/en-us/data-center/h100/), H100 NVL column: 1,671 TFLOPS sparse
    "H100 NVL": 835e12,
    # NVIDIA H100 data sheet, H100 PCIe column: 1,513 TFLOPS sparse
    "H100 PCIe": 756e12,
    # NVIDIA H100 data sheet, H100 SXM column: 1,979 TFLOPS sparse (torchtitan's MFU uses 989e12 for an H100)
    "H100": 989e12,
    # NVIDIA H800 SXM: the H100 SXM's tensor cores (NVIDIA H800 product brief: 1,979 TFLOPS sparse)
    "H800": 989e12,
    # NVIDIA GH200 Grace Hopper data sheet (https://www.nvidia.com/en-us/data-center/grace-hopper-superchip/): 1,979
    # TFLOPS sparse
    "GH200": 989e12,
    # NVIDIA H200 data sheet (https://www.nvidia.com/en-us/data-center/h200/), H200 SXM: 1,979 TFLOPS sparse
    "H200": 989e12,
    # NVIDIA HGX B200 (https://www.nvidia.com/en-us/data-center/hgx/): 36 PFLOPS sparse for 8 GPUs, 4.5 per GPU
    "B200": 2250e12,
    # NVIDIA A100 data sheet (https://www.nvidia.com/en-us/data-center/a100/), SXM and PCIe: 624 TFLOPS sparse
    "A100": 312e12,
    # A800: the A100's tensor cores (NVIDIA A800 product brief)
    "A800": 312e12,
    # NVIDIA L40S data sheet (https://www.nvidia.com/en-us/data-center/l40s/): 733 TFLOPS sparse
    "L40S": 362e12,
    # NVIDIA L40 data sheet (https://www.nvidia.com/en-us/data-center/l40/): 362 TFLOPS sparse
    "L40": 181e12,
    # NVIDIA L4 data sheet (https://www.nvidia.com/en-us/data-center/l4/): 242 TFLOPS sparse
    "L4": 121e12,
    # AWS's A10G, of EC2 G5 instances (https://aws.amazon.com/ec2/instance-types/g5/)
    "A10G": 70e12,
    # NVIDIA A10 data sheet (https://www.nvidia.com/en-us/data-center/products/a10-gpu/): 250 TFLOPS sparse
    "A10": 125e12,
}

# The GPU every measured constant of launch.facts.calibration was measured on (an H100 SXM, 80GB HBM3): a row of
# PEAK_BF16. A prediction for another GPU scales this GPU's peak to that GPU's.
CALIBRATION_GPU = "H100"


def peak_bf16(name: str | None) -> float | None:
    """The dense BF16 peak of the GPU torch calls `name` (torch.cuda.get_device_name()); None for a GPU not in the
    table, a CPU or no name."""
    if not name:
        return None
    return next((peak for key, peak in PEAK_BF16.items() if key in name), None)


CALIBRATION_PEAK = PEAK_BF16[CALIBRATION_GPU]
