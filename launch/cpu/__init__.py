"""Everything that exists only so that the real distributed path runs on CPU (gloo, no CUDA kernels).

`train.py` imports this package only when `use_cpu` is set; nothing on the GPU path imports it. Each
workaround lives in its own module, names the upstream behaviour it works around, and has a test that fails
without it.
"""


def enable_cpu_path(training_args) -> None:
    """Apply the CPU-only workarounds that this run's parallel layout needs. Called at the top of train.py."""
