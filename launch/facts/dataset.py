"""The dataset's length profile: each training row's tokens as the run's SFTTrainer prepares them, measured once before
any process starts, and what those lengths mean for the run's batches.

Measured with TRL's own preparation (`SFTTrainer._prepare_dataset`: the conversion to ChatML, the EOS of a plain text
row, the chat template, the labels of assistant-only or completion-only loss), called on the recipe's tokenizer (TRL's
`AutoProcessor` of the model) and its train split, so the lengths are the ones training sees. Reachable only: a local
dataset or one in the Hugging Face cache, a tokenizer in a local folder or the cache; nothing is downloaded (the hub
is switched offline while the dataset loads).

Each row is measured untruncated, with the span of its trained tokens (labels other than -100); `max_length` is
applied to those numbers afterwards exactly as TRL applies it (keep_start / keep_end, then the rows truncation left
without a trained token dropped; under packing no truncation before BFD, which cuts each row at max_length). So the
measurement does not depend on max_length, and a plan at another `--max-length` reuses it. It is cached under the
datasets cache (`HF_DATASETS_CACHE/llm-recipes-lengths/`), keyed by the dataset's fingerprint (datasets'
`_fingerprint`), the tokenizer and the preparation settings (datasets' `Hasher`).

What the lengths mean, computed, not assumed:
- padded batches (no packing): each micro-batch of `per_device_train_batch_size` rows is padded to its longest row
  (to a multiple of pad_to_multiple_of). The trainer's default sampler (`train_sampling_strategy: random`) draws each
  micro-batch as random rows without replacement, so the padding fraction is its expectation over such batches:
  1 - mean length / E[longest of k rows], E[longest] exact from the order statistics of the measured lengths. The
  longest micro-batch holds the dataset's longest row: the length the memory plan holds;
- packing: TRL's own `pack_dataset` run on a dataset that holds only the lengths (a null-typed token column), in
  TRL's order (shuffled with the run's seed when `shuffle_dataset`), so the packed rows are TRL's; the conversations
  per packed row and the fill (real tokens / packed rows x max_length) follow. A packed row is planned at max_length.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

CACHE_VERSION = 1
# the preparation settings (training arguments) that change a row's tokens, with their defaults
PREPARATION = {"dataset_text_field": "text", "assistant_only_loss": False, "completion_only_loss": None,
               "eos_token": None, "chat_template_path": None}
PLANNED_WITHOUT = "planned at full max_length rows"


@dataclass(frozen=True)
class Unmeasured:
    """Why a run has no length profile: its data or tokenizer are not reachable offline (`reachable` False), or the
    rows are not the kind measured here."""

    why: str
    reachable: bool = True

    def describe(self) -> str:
        return f"Dataset: {'not measured' if self.reachable else 'not reachable'}, {PLANNED_WITHOUT} ({self.why})."

    def as_json(self) -> dict:
        return {"measured": False, "reachable": self.reachable, "planned": PLANNED_WITHOUT, "why": self.why}


@dataclass(frozen=True)
class Lengths:
    """Each row's tokens as TRL prepares it, untruncated, and the span of its trained tokens (-1: none)."""

    lengths: list[int]
    first_trained: list[int]
    last_trained: list[int]
    cache: Path
    cached: bool  # read from the cache (else measured now)


@dataclass(frozen=True)
class Profile:
    """The length profile of the run's train split at its max_length and batch layout."""

    dataset: str
    lengths: list[int]  # the rows the run trains on, truncated as it truncates them
    dropped: int  # rows truncation left without a trained token (TRL drops them; not under packing)
    truncated: int  # rows longer than max_length
    max_length: int
    batch_rows: int  # per_device_train_batch_size
    pad_multiple: int  # pad_to_multiple_of (1: none)
    padding_free: bool  # the collator concatenates the rows (padding_free, or BFD packing): no padding
    padding_fraction: float  # padded batches: the expected share of a micro-batch's tokens that are padding
    packing: str | None  # the packing strategy, None without packing
    packed_rows: int | None  # the rows TRL's packing makes of these conversations
    sampler: str  # train_sampling_strategy
    cache: Path
    cached: bool

    @property
    def rows(self) -> int:
        return len(self.lengths)

    @property
    def tokens(self) -> int:
        return sum(self.lengths)

    @property
    def longest(self) -> int:
        return max(self.lengths, default=0)

    @property
    def per_packed_row(self) -> float | None:
        return self.rows / self.packed_rows if self.packed_rows else None

    @property
    def fill(self) -> float | None:
        """Packing: the share of the packed rows' max_length slots that hold tokens."""
        return self.tokens / (self.packed_rows * self.max_length) if self.packed_rows else None

    @property
    def attention_length(self) -> float | None:
        """Padding-free rows: the token-weighted mean conversation length, sum of l^2 / sum of l with each l cut at
        max_length (BFD cuts a longer row there, `bfd_split` splits it into max_length pieces and a rest), what a
        varlen attention's causal triangles cost per token (`launch.speed.model.attention_forward_flops`); None
        for padded batches."""
        if not (self.packing or self.padding_free) or not self.lengths:
            return None
        pieces = []
        for n in self.lengths:
            if self.packing == "bfd_split":
                pieces += [self.max_length] * (n // self.max_length) + ([n % self.max_length] if n % self.max_length
                                                                        else [])
            else:
                pieces.append(min(n, self.max_length))
        total = sum(pieces)
        return sum(n * n for n in pieces) / total if total else None

    @property
    def real_share(self) -> float:
        """The share of a planned row's tokens that are real (not padding): the packing's fill, else 1 - the padding
        fraction. What turns the throughput model's tokens/s into useful tokens/s."""
        return self.fill if self.packing else 1.0 - self.padding_fraction

    @property
    def processed_tokens(self) -> float:
        """Tokens the model processes for one pass over the rows: padded, each micro-batch at its longest row (in
        expectation); packed, the real tokens alone (BFD packing is padding-free)."""
        return self.tokens if self.packing or self.padding_free else self.tokens / (1.0 - self.padding_fraction)

    def peak_length(self, multiple: int = 1) -> int:
        """The row length the memory plan must hold: a packed row is max_length; a padded micro-batch is as long as
        its longest row, rounded up to `multiple` (what the layout pads to), never above max_length."""
        if self.packing or not self.lengths:
            return self.max_length
        return min(-(-self.longest // multiple) * multiple, max(self.max_length, multiple))

    def as_json(self) -> dict:
        out = {"measured": True, "name": self.dataset, "rows": self.rows, "tokens": self.tokens,
               "mean_length": round(self.tokens / self.rows, 1) if self.rows else None,
               "median_length": statistics.median(self.lengths) if self.lengths else None,
               "max_length_found": self.longest, "max_length": self.max_length, "truncated_rows": self.truncated,
               "dropped_rows": self.dropped, "per_device_train_batch_size": self.batch_rows,
               "padding_fraction": round(self.padding_fraction, 4), "padding_assumes": self.order(),
               "packing": self.packing, "peak_length": self.peak_length(),
               "real_share": round(self.real_share, 4), "cache": str(self.cache), "cached": self.cached}
        if self.packing:
            out.update(packed_rows=self.packed_rows, conversations_per_packed_row=round(self.per_packed_row, 3),
                       pack_fill=round(self.fill, 4))
        return out

    def order(self) -> str:
        """The batch order the padding fraction assumes."""
        if self.padding_free:
            return "none: the collator concatenates the rows (padding-free)"
        if self.sampler != "random":
            return (f"random micro-batches, but train_sampling_strategy is {self.sampler}: rows grouped by length "
                    "pad less than this")
        return "random micro-batches (train_sampling_strategy: random): the expectation over them"

    def describe(self) -> str:
        mean = self.tokens / self.rows if self.rows else 0
        median = statistics.median(self.lengths) if self.lengths else 0
        lines = [f"Dataset {self.dataset}: {self.rows:,} rows, {self.tokens:,} tokens; length mean {mean:,.1f}, median "
                 f"{median:,.1f}, max {self.longest:,} (at max_length {self.max_length:,}: {self.truncated:,} rows "
                 f"truncated" + (f", {self.dropped:,} dropped with no trained token left" if self.dropped else "")
                 + f"; {'cached' if self.cached else 'measured'}: {self.cache})"]
        if self.packing:
            lines.append(f"  packed ({self.packing}, TRL's pack_dataset on the lengths): {self.packed_rows:,} rows of "
                         f"max_length, {self.per_packed_row:.2f} conversations per packed row, filled "
                         f"{self.fill:.1%}; planned at max_length {self.max_length:,}")
        else:
            lines.append(f"  padded: {self.padding_fraction:.1%} of the tokens are padding at "
                         f"{self.batch_rows} row(s) per micro-batch ({self.order()}); the longest micro-batch holds "
                         f"the longest row, {self.longest:,} tokens: planned at {self.peak_length():,}")
        return "\n".join(lines)


def expected_longest(lengths: list[int], k: int) -> float:
    """E[the longest of k rows drawn at random without replacement]: sorted ascending, the j-th (0-based) is the
    longest with probability C(j, k-1) / C(n, k)."""
    ordered = sorted(lengths)
    n = len(ordered)
    k = min(max(k, 1), n)
    log_total = math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
    expected, log_ways = 0.0, 0.0  # log C(j, k-1) at j = k-1
    for j in range(k - 1, n):
        if j > k - 1:
            log_ways += math.log(j / (j - k + 1))
        expected += ordered[j] * math.exp(log_ways - log_total)
    return expected


def padding_fraction(lengths: list[int], batch_rows: int, multiple: int = 1) -> float:
    """The expected share of padding in a micro-batch of `batch_rows` random rows, each padded to the longest (to a
    multiple of `multiple`)."""
    if not lengths:
        return 0.0
    padded = expected_longest([-(-n // multiple) * multiple for n in lengths], batch_rows)
    return 1.0 - statistics.fmean(lengths) / padded if padded else 0.0


def packed_rows(lengths: list[int], max_length: int, strategy: str, seed: int | None = None) -> int:
    """The rows TRL's `pack_dataset` makes of rows of these lengths (in this order; shuffled first with `seed` as
    SFTTrainer does under `shuffle_dataset`), run on a dataset whose token column holds nulls: no token is stored."""
    import numpy as np
    import pyarrow as pa
    from datasets import Dataset
    from trl import pack_dataset

    offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
    column = pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()), pa.nulls(int(offsets[-1])))
    dataset = Dataset(pa.table({"input_ids": column}))
    if seed is not None:
        dataset = dataset.shuffle(seed=seed)
    return len(pack_dataset(dataset, max_length, strategy, {"keep_in_memory": True}))


def profile(training: dict, progress=None, cache_dir: Path | None = None) -> Profile | Unmeasured:
    """The run's length profile from its merged training arguments, or why there is none."""
    say = progress or (lambda text: print(text, file=sys.stderr, flush=True))
    if training.get("synthetic"):
        return Unmeasured("a synthetic run's rows are max_length random tokens")
    max_length = training.get("max_length")
    if not max_length:
        return Unmeasured("max_length is not set (no truncation): nothing to plan the rows against")
    measured = measure(training, say, cache_dir)
    if isinstance(measured, Unmeasured):
        return measured
    keep_end = training.get("truncation_mode") == "keep_end"
    strategy = (training.get("packing_strategy") or "bfd") if training.get("packing") else None
    kept, dropped = [], 0
    for n, first, last in zip(measured.lengths, measured.first_trained, measured.last_trained, strict=True):
        # packing: no truncation before it and no row dropped; BFD cuts each row at max_length, leaves out empty ones
        keeps = n > 0 if strategy else last >= 0 and (last >= n - max_length if keep_end else first < max_length)
        if keeps:
            kept.append(min(n, max_length))
        else:
            dropped += 1
    multiple = training.get("pad_to_multiple_of")
    multiple = int(multiple) if isinstance(multiple, int) or str(multiple).isdigit() else 1
    batch = int(training.get("per_device_train_batch_size") or 8)
    padding_free = bool(training.get("padding_free")) or strategy in ("bfd", "bfd_split")
    seed = int(training.get("seed", 42)) if training.get("shuffle_dataset") else None
    return Profile(
        dataset=str(training.get("dataset_name")), lengths=kept, dropped=dropped,
        truncated=sum(n > max_length for n in measured.lengths), max_length=int(max_length), batch_rows=batch,
        pad_multiple=multiple, padding_free=padding_free,
        # packed rows are full but for the last of each packing batch: the fill says what is empty
        padding_fraction=0.0 if padding_free or strategy else padding_fraction(kept, batch, multiple),
        packing=strategy, packed_rows=packed_rows(kept, int(max_length), strategy, seed) if strategy else None,
        sampler=str(training.get("train_sampling_strategy") or "random"), cache=measured.cache,
        cached=measured.cached)


def measure(training: dict, say, cache_dir: Path | None = None) -> Lengths | Unmeasured:
    """Each train row's tokens and trained span, from the cache or measured now (and cached); or why not."""
    name = training.get("dataset_name")
    if training.get("datasets"):
        return Unmeasured("a `datasets:` mixture is not measured")
    if not name:
        return Unmeasured("no dataset_name is set")
    if training.get("dataset_streaming"):
        return Unmeasured("a streamed dataset is not measured (it would be read whole)")
    if (training.get("dataset_kwargs") or {}).get("skip_prepare_dataset"):
        return Unmeasured("skip_prepare_dataset: the rows are not prepared by TRL")
    if training.get("join_documents_min_chars"):
        return Unmeasured("joined documents (join_documents_min_chars) are not measured")
    template = training.get("chat_template_path")
    if template and not (os.path.isfile(template) and template.endswith((".jinja", ".j2"))):
        return Unmeasured("a chat template cloned from another model (chat_template_path) is not measured")
    model = training.get("model_name_or_path")
    if not model:
        return Unmeasured("no model_name_or_path is set (the tokenizer is the model's)")
    if where := _where(str(name), "dataset") or _where(str(model), "model"):
        return Unmeasured(where, reachable=False)
    try:
        tokenizer = _processing_class(training)
        train = _train_split(training)
    except Exception as e:  # noqa: BLE001 - a dataset or tokenizer that does not load is reported, not fatal
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return Unmeasured(f"it did not load offline: {type(e).__name__}: {first}", reachable=False)
    from datasets.fingerprint import Hasher

    settings = {k: training.get(k, default) for k, default in PREPARATION.items()}
    key = Hasher.hash([CACHE_VERSION, train._fingerprint, tokenizer, settings])
    cache = (cache_dir or _cache_root()) / f"{key}.json"
    if cache.is_file():
        try:
            data = json.loads(cache.read_text())
            return Lengths(data["lengths"], data["first_trained"], data["last_trained"], cache, True)
        except (OSError, ValueError, KeyError):
            pass  # a broken cache file is measured again
    if "image" in train.column_names or "images" in train.column_names:
        return Unmeasured("a vision dataset is prepared on the fly by its collator: not measured")
    say(f"measuring the token lengths of {len(train):,} rows of {name} with TRL's preparation (once; cached in "
        f"{cache.parent})")
    lengths = _measure(train, tokenizer, training, settings)
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_suffix(".tmp")
    tmp.write_text(json.dumps({"dataset": str(name), **lengths}))
    os.replace(tmp, cache)
    return Lengths(lengths["lengths"], lengths["first_trained"], lengths["last_trained"], cache, False)


def _measure(train, tokenizer, training: dict, settings: dict) -> dict:
    """TRL's preparation, without truncation or packing (applied to the numbers later), then each row's length and
    trained span. SFTTrainer's method reads three attributes of the trainer, set here as its __init__ sets them."""
    from trl import SFTTrainer
    from trl.chat_template_utils import get_training_chat_template, has_generation_markers

    text = getattr(tokenizer, "tokenizer", tokenizer)  # a processor's tokenizer, as SFTTrainer's `_tokenizer`
    if settings["eos_token"]:
        text.eos_token = settings["eos_token"]
    if settings["chat_template_path"]:
        tokenizer.chat_template = Path(settings["chat_template_path"]).read_text(encoding="utf-8")
    first = train[0]
    completion_only = settings["completion_only_loss"]
    trainer = SimpleNamespace(
        _tokenizer=text,
        chat_template=get_training_chat_template(tokenizer) if settings["assistant_only_loss"]
        and not has_generation_markers(tokenizer.chat_template) else None,
        completion_only_loss=("prompt" in first and "completion" in first) if completion_only is None
        else completion_only)
    args = SimpleNamespace(dataset_num_proc=training.get("dataset_num_proc"), max_length=None, shuffle_dataset=False,
                           dataset_text_field=settings["dataset_text_field"],
                           assistant_only_loss=settings["assistant_only_loss"])
    prepared = SFTTrainer._prepare_dataset(trainer, train, tokenizer, args, False, None, "train")

    def spans(labels: list[list[int]]) -> dict:
        trained = [[i for i, label in enumerate(row) if label != -100] for row in labels]
        return {"length": [len(row) for row in labels], "first": [t[0] if t else -1 for t in trained],
                "last": [t[-1] if t else -1 for t in trained]}

    counted = prepared.map(spans, input_columns="labels", batched=True, remove_columns=prepared.column_names,
                           keep_in_memory=True, num_proc=training.get("dataset_num_proc"),
                           desc="Counting the rows' tokens")
    counted = counted.to_dict()
    return {"lengths": counted["length"], "first_trained": counted["first"], "last_trained": counted["last"]}


def _where(name: str, kind: str) -> str | None:
    """None if `name` is a local path or in the Hugging Face cache; else the reason it is not reachable."""
    from launch.facts import hub

    if Path(name).expanduser().exists():
        return None
    if hub.looks_local(name) or hub.repo_id_problem(name) or not hub.in_hub_cache(name, kind):
        return f"the {kind} {name} is neither a local path nor in the Hugging Face cache"
    return None


class _Offline:
    """The hub switched off while a dataset or tokenizer loads: what is not cached fails instead of downloading
    (huggingface_hub refuses every request; datasets falls back to its cached copy)."""

    def __enter__(self):
        import datasets.config
        from huggingface_hub import constants

        self.saved = constants.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE
        constants.HF_HUB_OFFLINE = datasets.config.HF_HUB_OFFLINE = True

    def __exit__(self, *exc):
        import datasets.config
        from huggingface_hub import constants

        constants.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE = self.saved


def _processing_class(training: dict):
    """The model's processing class as SFTTrainer loads it when train.py passes none (`AutoProcessor`)."""
    from transformers import AutoProcessor

    with _Offline():
        return AutoProcessor.from_pretrained(training["model_name_or_path"], revision=training.get("model_revision"),
                                             trust_remote_code=bool(training.get("trust_remote_code")),
                                             local_files_only=True)


def _train_split(training: dict):
    """The train split as train.py loads it (`load_dataset(dataset_name, name=dataset_config)`)."""
    from datasets import load_dataset

    with _Offline():
        dataset = load_dataset(str(Path(training["dataset_name"]).expanduser())
                               if Path(training["dataset_name"]).expanduser().exists() else training["dataset_name"],
                               name=training.get("dataset_config"))
    return dataset[training.get("dataset_train_split") or "train"]


def _cache_root() -> Path:
    import datasets.config

    return Path(datasets.config.HF_DATASETS_CACHE) / "llm-recipes-lengths"
