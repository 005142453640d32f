"""What the training processes import (besides `launch.cpu`, the CPU-only pieces): heartbeats and callbacks
(`monitor`), throughput and memory measurements (`measure`), the first-steps loss sentinel (`sentinel`), synthetic
inputs (`synthetic`), partial activation checkpointing (`partial_checkpointing`) and the names of a run folder's
files (`run_files`, which the launcher reads too).

The boundary: nothing here imports the launcher (any module of `launch` outside `launch.rank` and `launch.cpu`), so a
train script under plain `accelerate launch` loads none of it (tests/test_docs.py checks the imports).
"""
