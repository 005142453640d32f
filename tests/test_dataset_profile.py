"""The dataset's length profile (launch/facts/dataset.py): the token lengths TRL's preparation gives each row, checked
against an independent count and against a real SFTTrainer's own datasets and batches; the padding and packing
figures from them; `plan` planning at the longest row; a run reporting its non-pad tokens/s."""

from __future__ import annotations

import itertools
import json
import random
import statistics

import pytest

from helpers.launcher import explain, launch_in_process
from launch.config import smoke
from launch.facts import dataset
from launch.rank.measure import real_tokens

MAX_LENGTH = 64
BATCH = 4


def _conversation(rng: random.Random, items: int) -> dict:
    values = [rng.randrange(10) for _ in range(items)]
    words = [smoke.NUMBER_WORDS[v] for v in values]
    return {"messages": [{"role": "user", "content": "sort these numbers : " + " , ".join(words)},
                         {"role": "assistant", "content": "sorted : " + " , ".join(sorted(words))}]}


@pytest.fixture(scope="module")
def skewed(tmp_path_factory):
    """A chat dataset with skewed lengths, made deterministically: most rows short, a few long, two past
    MAX_LENGTH; in the smoke tokenizer's words, with the smoke model's tokenizer."""
    rng = random.Random(7)
    items = [2] * 24 + [6] * 8 + [10] * 4 + [40, 40]
    rng.shuffle(items)
    folder = tmp_path_factory.mktemp("skewed")
    (folder / "train.jsonl").write_text("".join(json.dumps(_conversation(rng, n)) + "\n" for n in items))
    model = smoke.ensure_smoke_assets(progress=lambda *_: None)["model"]
    training = {"dataset_name": str(folder), "model_name_or_path": model, "max_length": MAX_LENGTH,
                "per_device_train_batch_size": BATCH, "seed": 42}
    return training, folder


def _profile(training, tmp_path, **extra):
    found = dataset.profile({**training, **extra}, progress=lambda *_: None, cache_dir=tmp_path / "lengths")
    assert isinstance(found, dataset.Profile), found.describe()
    return found


def test_the_profile_counts_what_the_chat_template_gives_each_row(skewed, tmp_path):
    training, folder = skewed
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(training["model_name_or_path"])
    rows = [json.loads(line) for line in (folder / "train.jsonl").read_text().splitlines()]
    full = [len(tokenizer.apply_chat_template(r["messages"], tokenize=True, return_dict=True)["input_ids"])
            for r in rows]
    expected = [min(n, MAX_LENGTH) for n in full]
    found = _profile(training, tmp_path)
    assert found.lengths == expected
    assert (found.rows, found.tokens, found.longest) == (len(rows), sum(expected), max(expected))
    assert found.truncated == sum(n > MAX_LENGTH for n in full) == 2
    as_json = found.as_json()
    assert as_json["mean_length"] == round(statistics.fmean(expected), 1)
    assert as_json["median_length"] == statistics.median(expected)
    # the padding of a micro-batch of BATCH random rows: every batch of the dataset, enumerated
    batches = list(itertools.combinations(expected, BATCH))
    padded = sum(BATCH * max(b) for b in batches)
    assert found.padding_fraction == pytest.approx(1 - sum(map(sum, batches)) / padded, rel=1e-9)
    assert 0.3 < found.padding_fraction < 0.9  # skewed: most rows pad to a long one
    assert found.peak_length() == max(expected) and found.peak_length(multiple=48) == MAX_LENGTH
    # measured once: the second profile reads the cache, keyed by the dataset's fingerprint and the tokenizer
    assert not found.cached and _profile(training, tmp_path, max_length=32).cached
    assert not _profile(training, tmp_path, dataset_text_field="other").cached  # another preparation
    assert "not measured" not in found.describe() and "padding at 4 row(s)" in found.describe()


def test_lengths_and_batches_match_a_real_sfttrainer_and_packing_processes_fewer_tokens(skewed, tmp_path):
    """SFTTrainer's own prepared datasets and batches on the same data: the padded rows' lengths are the profile's,
    the packed rows are as many as the profile's packing, the non-pad count of every batch is exact, and one epoch
    of packed batches processes fewer tokens than of padded ones, as the profile says."""
    from datasets import load_dataset
    from trl import SFTConfig, SFTTrainer

    training, folder = skewed
    train = load_dataset(str(folder))["train"]

    def trainer(**kwargs):
        args = SFTConfig(output_dir=str(tmp_path / "out"), max_length=MAX_LENGTH, per_device_train_batch_size=BATCH,
                         use_cpu=True, report_to="none", dataset_num_proc=None, **kwargs)
        return SFTTrainer(model=training["model_name_or_path"], args=args, train_dataset=train)

    def epoch(t, pad_multiple=None):
        processed = real = 0
        for batch in t.get_train_dataloader():
            processed += batch["input_ids"].numel()
            real += int(real_tokens(batch["input_ids"], batch, pad_multiple))
        return processed, real

    padded, packed = _profile(training, tmp_path), _profile(training, tmp_path, packing=True)
    plain = trainer()
    assert [len(r) for r in plain.train_dataset["input_ids"]] == padded.lengths
    processed_padded, real_padded = epoch(plain)
    assert real_padded == padded.tokens  # every row once, its padding not counted
    packing = trainer(packing=True, pad_to_multiple_of=8)
    assert len(packing.train_dataset) == packed.packed_rows < padded.rows
    assert packed.per_packed_row == pytest.approx(padded.rows / packed.packed_rows)
    processed_packed, real_packed = epoch(packing, pad_multiple=8)
    assert real_packed == packed.tokens == padded.tokens  # padding-free: only the tail pad to 8 is not real
    assert processed_packed < processed_padded
    # one epoch in the sampler's order against the profile's expectation over random batches
    assert processed_padded == pytest.approx(padded.processed_tokens, rel=0.25)
    assert packed.processed_tokens == packed.tokens < padded.processed_tokens
    assert packed.real_share == pytest.approx(packed.tokens / (packed.packed_rows * MAX_LENGTH))


def test_plan_shows_the_profile_and_plans_the_longest_row(skewed):
    training, _ = skewed
    proc = launch_in_process("plan", "ddp", "--gpus", "2", "--json", "--", "--dataset_name",
                             training["dataset_name"], "--model_name_or_path", training["model_name_or_path"],
                             "--max_length", str(MAX_LENGTH), "--packing", "false")  # padded (ddp packs)
    assert proc.returncode == 0, explain(proc)
    out = json.loads(proc.stdout)
    data = out["dataset"]
    assert data["measured"] and data["rows"] == 38 and data["max_length"] == MAX_LENGTH
    # a padded batch peaks at the dataset's longest row (here max_length: two rows are truncated to it)
    assert out["max_length"] == data["peak_length"] == data["max_length_found"]
    useful = out["predicted_useful_tokens_per_s_per_gpu"]
    assert useful == pytest.approx(out["predicted_tokens_per_s_per_gpu"] * (1 - data["padding_fraction"]), rel=1e-3)


def test_a_dataset_out_of_reach_is_planned_at_max_length():
    found = dataset.profile({"dataset_name": "nobody/not-cached-anywhere", "model_name_or_path": "Qwen/Qwen3-0.6B",
                             "max_length": 2048})
    assert isinstance(found, dataset.Unmeasured) and not found.reachable
    assert found.describe().startswith("Dataset: not reachable, planned at full max_length rows (")
    assert found.as_json()["measured"] is False


def test_the_non_pad_count_of_padded_and_padding_free_batches():
    import torch

    ids = torch.ones(2, 6, dtype=torch.long)
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]])
    assert int(real_tokens(ids, {"attention_mask": mask}, None)) == 10
    # padding-free: two sequences (3 and 2 tokens) then a pad to a multiple of 8
    flat = torch.ones(1, 8, dtype=torch.long)
    positions = torch.tensor([[0, 1, 2, 0, 1, 0, 0, 0]])
    assert int(real_tokens(flat, {"position_ids": positions}, 8)) == 5
    assert int(real_tokens(flat, {"position_ids": positions}, None)) == 8  # no pad multiple: nothing padded


@pytest.mark.slow
def test_a_run_reports_its_padding_and_non_pad_tokens_per_second(smoke_runs, tmp_path):
    """The shared ddp smoke run (2 processes, 4 rows per micro-batch of the smoke data): its summary holds the
    measured non-pad tokens/s beside all tokens/s, and the padding it measured is near the profile's expectation."""
    proc, summary = smoke_runs.run("ddp")
    assert proc.returncode == 0, explain(proc)
    overall = summary["bench"]["overall"]
    assert 0 < overall["non_pad_tokens_per_s"] < overall["tokens_per_s"] == summary["tokens_per_second"]
    assert summary["non_pad_tokens_per_second"] == overall["non_pad_tokens_per_s"]
    assets = smoke.ensure_smoke_assets(progress=lambda *_: None)
    expected = _profile({"dataset_name": assets["data"], "model_name_or_path": assets["model"], "max_length": 128,
                         "per_device_train_batch_size": 4}, tmp_path)
    assert overall["padding_fraction"] == pytest.approx(expected.padding_fraction, abs=0.1)
    assert "non-pad:" in proc.stdout


@pytest.mark.slow
@pytest.mark.long
def test_a_run_on_skewed_chats_reports_padding_and_packing_processes_fewer_tokens(skewed, tmp_path):
    """One epoch over the same skewed conversations, padded and then packed (bfd, padding-free), one process each:
    both summaries report the measured padding fraction and non-pad tokens/s, and the Trainer's own count of the
    input tokens it processed (`include_num_input_tokens_seen`, independent of the launcher's counting) is smaller
    packed, by about the padding the padded run measured."""
    training, folder = skewed
    seen, overall = {}, {}
    for packing in ("false", "true"):
        out = tmp_path / f"packing-{packing}"
        proc = launch_in_process("ddp", "--smoke", "--cpu", "--num-processes", "1", "--output-dir", out, "--",
                                 "--dataset_name", folder, "--max_length", MAX_LENGTH, "--max_steps", "-1",
                                 "--num_train_epochs", "1", "--include_num_input_tokens_seen", "true",
                                 "--packing", packing)
        assert proc.returncode == 0, explain(proc)
        summary = json.loads((out / "run_summary.json").read_text())
        overall[packing] = summary["bench"]["overall"]
        assert summary["non_pad_tokens_per_second"] == overall[packing]["non_pad_tokens_per_s"] > 0
        seen[packing] = json.loads((out / "trainer_state.json").read_text())["num_input_tokens_seen"]
    assert overall["false"]["padding_fraction"] > 0.2  # the skewed rows padded to the longest of each micro-batch
    assert overall["true"]["padding_fraction"] == 0  # padding-free: every token a conversation's
    assert seen["true"] < seen["false"] * (1 - overall["false"]["padding_fraction"] / 2)
