"""CPU enablement for training scripts that are not this repository's train.py, e.g. TRL's own `trl sft` (its
`trl/scripts/sft.py` does not call `launch.cpu.enable_cpu_path`). Put this folder on PYTHONPATH for a CPU run:

    PYTHONPATH=launch/cpu/site trl sft --config recipes/zero3/config.yaml --num_processes 2 ... --use_cpu true

Python imports this module at the start of every process of the job; it registers the two CPU workarounds a plain
DDP or ZeRO run needs: the gloo exit pause of launch/cpu/gloo_exit.py (without it about 1 DeepSpeed CPU run in 4
aborts at interpreter exit after training) and, in a DeepSpeed job's ranks, launch/cpu/deepspeed_shm.py (without it
DeepSpeed JIT-compiles an inference-only op at start: 35 s to minutes of silence on a first run). The CP and SP
workarounds need our train.py.
"""

try:
    from launch.cpu import deepspeed_shm
    from launch.cpu.gloo_exit import let_gloo_workers_finish_at_exit
except ImportError:  # this repository is not installed: nothing to do
    pass
else:
    let_gloo_workers_finish_at_exit()
    deepspeed_shm.skip_build()  # only where ACCELERATE_USE_DEEPSPEED is set: `accelerate launch` sets it for ranks
