"""The memory model behind `python -m launch plan`: per-GPU and per-host memory of a run, term by term.

Pure Python, no I/O, nothing heavy imported (the re-measuring helpers of its CPU constants live in
tests/helpers/memory_measure.py). Every term is a small function of (architecture, run shape) whose docstring
says what it counts and from which upstream code (read against torch 2.13, transformers 5.23, accelerate 1.15,
deepspeed 0.19.8, trl 1.16). Sizes are bytes inside the functions and GiB (2**30 bytes) in the `Term`s.

How a peak is assembled
-----------------------
A training step goes through phases that never overlap in time, so the peak is the largest phase, not the sum:

- the *loss* phase (end of the forward, start of the backward): model states, communication buffers, gathered
  parameters, checkpointed activations kept on the GPU, autocast's 16-bit copies of fp32 weights (fp32 masters
  under DDP), and the loss working set (logits or fused-loss buffers);
- the *layer* phase (backward through the decoder): the same static terms and checkpoints, plus the working set of
  ONE layer's recomputation and backward (every tensor that layer saves for its backward, plus the gradients and
  kernel workspaces alive at the worst moment of its backward);
- the *optimizer step*: model states plus the step's temporaries (activations are gone by then);
- the *end of backward* (a tied LM head under DDP): model states plus the embedding's gradient summed into the LM
  head's. With one micro-batch per step (DDP / FSDP2) the gradients are None until the backward makes them, so the
  loss phase holds none and the layer phase the worse of its two ends (`launch/memory/trace.py` measured it).

The terms of the phase that gives the peak are summed (`Term.counted`); the other phase's term is listed for
information. On top of the allocated peak, the overhead model (the measured parts in launch/facts/calibration.py, with
their H100 source): CUDA context and workspaces, NCCL buffers and the caching allocator's reserve.

Bytes per parameter follow the run's `Precision` (`RunShape.precision`, launch/config/precision.py): the dtype of the
trainable parameters, gradients and optimizer states, and where the fp32 masters live, per strategy.
Sharding follows the run's `Layout`: ZeRO partitions over all ranks but TP, FSDP1/FSDP2 shard over dp_shard x cp
and replicate across dp_replicate (HSDP). An adapter run (`RunShape.adapter`, launch/config/adapter.py) trains only the
adapter: its parameters get gradients and optimizer states, the base is frozen in its dtype or 4-bit
(`adapters.py`). Host memory per node: offloaded states and checkpoints per process, and the transient whole-model
copies that loading reads before training.

Calibration (tests/test_memory.py) uses published measurements only, each with its source beside it.
"""

from launch.memory.architecture import LAYER_LINEARS, OUTPUT_LAYER, Architecture
from launch.memory.constants import H100_80GB_GIB
from launch.memory.estimate import estimate, fits, longest_length
from launch.memory.report import format_table
from launch.memory.results import Estimate, Term
from launch.memory.run_shape import RunShape

__all__ = ["LAYER_LINEARS", "OUTPUT_LAYER", "Architecture", "Estimate", "H100_80GB_GIB", "RunShape", "Term",
           "estimate", "fits", "format_table", "longest_length"]
