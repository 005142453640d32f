"""The first-steps loss sentinel inside the ranks: a TrainerCallback that checks the first logged losses
against the band the launcher hands over in LAUNCH_FIRST_LOSS_BAND (`launch.results.sentinel` reads and checks the
band), and stops every rank at once when one is outside it.

Rank side: imports nothing of the launcher but `launch.rank.run_files` (names only).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from launch.rank import run_files  # names only

ENV = "LAUNCH_FIRST_LOSS_BAND"

TRAPS = (
    "RoPE scaling not applied (model_init_kwargs.rope_parameters: positions beyond the ones the model was trained "
    "on; TRL PR #6846: first loss 10.6 instead of 4.4 at 1M tokens without YaRN)",
    "packing across documents under context parallelism (CP drops the attention mask, so packed documents attend "
    "to each other)",
    "wrong dtype or precision (dtype, bf16/fp16 flags, a checkpoint loaded in another dtype than it was trained in)",
    "wrong chat template or labels (chat_template_path, assistant_only_loss / completion_only_loss, a dataset "
    "format other than the one recorded)",
)


# A synthetic run's band (kind "random_init") is the first loss of a random model on random tokens, about
# ln(vocabulary): what moves it is the numerics, not the data.
RANDOM_INIT_TRAPS = (
    "the loss reduced wrongly over the ranks (summed instead of averaged, or divided by the context- or "
    "sequence-parallel size twice)",
    "the weights not initialised as the config says (initializer_range), or loaded in the wrong dtype",
    "overflow or NaN in a low-precision kernel (fp16/bf16 attention, a fused loss)",
    "labels not aligned with the inputs (every token is trained in a synthetic run)",
)


class FirstLossError(RuntimeError):
    """Raised in every rank when a first logged loss is outside the recorded band."""


def message(loss: float, step: int, index: int, band: dict) -> str:
    where = " ".join(x for x in (band.get("recipe"), band.get("profile")) if x)
    random_init = band.get("kind") == "random_init"
    traps = RANDOM_INIT_TRAPS if random_init else TRAPS
    first = (f"first-steps loss sentinel: logged loss {loss:.4g} at step {step} (log {index} of the first "
             f"{band['steps']} checked) is outside the band [{band['low']:g}, {band['high']:g}] recorded"
             + (f" for {where}" if where else "") + f" ({band['source']}); the run was stopped. Likely traps: "
             + "; ".join(f"({i + 1}) {t}" for i, t in enumerate(traps)) + ".")
    # one line (the launcher quotes an exception's first line), then how to go on
    if random_init:
        return (first + "\nA random model cannot start far from ln(vocabulary): look for the trap; "
                "--no-loss-sentinel runs without the check.")
    return (first + "\nIf the setup is right and the band is not (another model, data or length than recorded), "
            "re-record the band in the recipe's expected_metrics.json or run without it.")


def check(loss, band: dict) -> bool:
    return isinstance(loss, (int, float)) and math.isfinite(loss) and band["low"] <= loss <= band["high"]


def sentinel_callback(band: dict | None = None, folder: Path | None = None):
    """The ranks' side: a TrainerCallback that checks the first `steps` logged training losses."""
    from transformers import TrainerCallback

    band = band if band is not None else json.loads(os.environ[ENV])
    if folder is None and os.environ.get(run_files.MONITOR_ENV):
        folder = Path(os.environ[run_files.MONITOR_ENV])
    rank = int(os.environ.get("RANK", "0"))

    class LossSentinel(TrainerCallback):
        def __init__(self):
            self.seen: list[dict] = []

        def on_step_end(self, args, state, control, **kwargs):
            # log each of the first `steps` steps whatever logging_steps is, so the band is about single steps
            if len(self.seen) < band["steps"]:
                control.should_log = True
            return control

        def on_log(self, args, state, control, logs=None, **kwargs):
            if not logs or "loss" not in logs or len(self.seen) >= band["steps"]:
                return
            loss = float(logs["loss"])
            self.seen.append({"step": state.global_step, "loss": loss})
            if not check(loss, band):
                self._verdict("stopped")
                raise FirstLossError(message(loss, state.global_step, len(self.seen), band))
            if len(self.seen) == band["steps"]:
                self._verdict("passed")

        def _verdict(self, outcome: str):
            if rank != 0 or folder is None:
                return
            try:
                folder.mkdir(parents=True, exist_ok=True)
                (folder / run_files.SENTINEL_VERDICT).write_text(json.dumps({"verdict": outcome, "band": band,
                                                               "losses": self.seen}))
            except OSError:
                pass

    return LossSentinel()
