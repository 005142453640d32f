"""Packing proven on CPU: TRL's `bfd` packing keeps conversations apart, and trains the same loss as padded batches.

Everything is TRL's own path, in this process (no torchrun): an `SFTTrainer` with `packing: true` prepares the
dataset (tokenizes, packs best-fit-decreasing into rows of `max_length` with a `seq_lengths` column) and builds the
collator (padding-free: one flat row, `position_ids` restarting at each conversation, no attention mask); the loss
is the trainer's `compute_loss` (TRL's fused LM head, `use_cache=False`), normalised as `Trainer` normalises it across
micro-batches (`get_batch_samples`' `num_items_in_batch`). The model is the smoke profile's tiny Qwen3
(`launch.config.smoke`, built in memory, fp32); the chats are generated here with skewed lengths (many short, a few
long), so that a packed row holds conversations of very different lengths.

Each proof has its control: the same check run with isolation broken (the packed-sequence detection of transformers'
masks switched off, as an attention that ignores `position_ids` would; or `position_ids` dropped from the batch, as
a collator that loses them would) must fail, so that a check cannot pass vacuously.
"""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")

MAX_LENGTH = 256  # the longest generated chat (~210 tokens) fits: neither packing nor padding truncates
ROWS_PER_MICRO_BATCH = 2  # packed rows per micro-batch (the collator concatenates them into one flat row)
CHATS_PER_MICRO_BATCH = 4  # padded rows per micro-batch


def skewed_chats(n: int = 24, seed: int = 7) -> list[dict]:
    """Chats in the smoke data's form (sort number words), most of 1-4 numbers, one in six of 30-50: lengths from
    ~14 to ~210 tokens. Deterministic, no download."""
    from launch.config.smoke import NUMBER_WORDS

    rng = random.Random(seed)
    chats = []
    for i in range(n):
        count = rng.randint(30, 50) if i % 6 == 0 else rng.randint(1, 4)
        values = [rng.randrange(10) for _ in range(count)]
        question = "sort these numbers : " + " , ".join(NUMBER_WORDS[v] for v in values)
        answer = "sorted : " + " , ".join(NUMBER_WORDS[v] for v in sorted(values))
        chats.append({"messages": [{"role": "user", "content": question},
                                   {"role": "assistant", "content": answer}]})
    return chats


def make_trainer(tmp_path, packing: bool, **config):
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    from launch.config import smoke

    tokenizer = smoke.build_tokenizer()
    args = SFTConfig(output_dir=str(tmp_path), packing=packing, max_length=MAX_LENGTH, use_cpu=True, report_to=[],
                     per_device_train_batch_size=ROWS_PER_MICRO_BATCH if packing else CHATS_PER_MICRO_BATCH,
                     save_strategy="no", logging_strategy="no", seed=0,
                     activation_checkpointing=False,  # TRL's default is on: recomputation only costs time here
                     **config)
    # the same initial weights in every trainer (smoke.build_model seeds its own RNG)
    chats = Dataset.from_list(skewed_chats())
    return SFTTrainer(model=smoke.build_model(tokenizer), args=args, train_dataset=chats,
                      eval_dataset=chats if args.eval_strategy != "no" else None, processing_class=tokenizer)


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    return make_trainer(tmp_path_factory.mktemp("packed"), packing=True)


@pytest.fixture(scope="module")
def padded(tmp_path_factory):
    return make_trainer(tmp_path_factory.mktemp("padded"), packing=False)


def micro_batches(trainer, size: int) -> list[dict]:
    """The trainer's dataset in order, collated by its collator `size` rows at a time (the sampler's shuffling left
    out: the parity compares the same conversations, not the same order)."""
    rows = [trainer.train_dataset[i] for i in range(len(trainer.train_dataset))]
    return [trainer.data_collator(rows[i:i + size]) for i in range(0, len(rows), size)]


def without_packed_detection(monkeypatch):
    """Isolation broken at the attention: transformers' masks no longer see the documents in `position_ids`, as
    with an attention that ignores them (every position then attends to every earlier one of the flat row)."""
    from transformers import masking_utils

    monkeypatch.setattr(masking_utils, "find_packed_sequence_indices", lambda position_ids: None)


def without_position_ids(batch: dict) -> dict:
    """Isolation broken in the collator: the batch without `position_ids` (the model then numbers the flat row 0..L-1,
    one long document)."""
    return {k: v for k, v in batch.items() if k != "position_ids"}


# ---- what TRL's bfd packing turns on ------------------------------------------------------------------------------

@pytest.mark.parametrize("label_option", [{}, {"assistant_only_loss": True}, {"completion_only_loss": False}],
                         ids=["plain", "assistant_only_loss", "completion_only_loss_false"])
def test_bfd_packing_is_padding_free_with_positions_per_conversation(label_option, packed, tmp_path):
    """`packing: true` (strategy `bfd`, TRL's default) turns padding-free on: the collator returns one flat row per
    micro-batch with `position_ids` restarting at 0 at every conversation and no attention mask, and the first token
    of each conversation is not a target. The loss options (which only build the labels column) keep all of it."""
    trainer = packed if not label_option else make_trainer(tmp_path, packing=True, **label_option)
    assert trainer.args.packing_strategy == "bfd" and trainer.padding_free and trainer.data_collator.padding_free
    rows = [trainer.train_dataset[i] for i in range(ROWS_PER_MICRO_BATCH)]
    batch = trainer.data_collator(rows)
    assert "attention_mask" not in batch
    lengths = [n for row in rows for n in row["seq_lengths"]]
    assert len(lengths) > ROWS_PER_MICRO_BATCH  # conversations share rows
    expected = torch.cat([torch.arange(n) for n in lengths])
    assert torch.equal(batch["position_ids"][0], expected)
    assert (batch["labels"][0][expected == 0] == -100).all()


def test_eval_packing_without_packing_collates_packed_rows_padded(tmp_path):
    """Why rules.eval_packing_keeps_conversations_apart refuses it: TRL packs the eval set (bfd, its seq_lengths
    column) but turns padding-free on from `packing` alone, so the packed eval rows get an all-ones attention mask
    and no position_ids: one causal sequence per row, its conversations attending to each other."""
    trainer = make_trainer(tmp_path, packing=False, eval_packing=True, eval_strategy="steps", eval_steps=1)
    rows = [trainer.eval_dataset[i] for i in range(2)]
    assert len(rows[0]["seq_lengths"]) > 1  # packed
    batch = trainer.data_collator(rows)
    assert "position_ids" not in batch and bool(batch["attention_mask"][0].all())


# ---- (a) isolation: one conversation changed, every other one's per-token losses bitwise the same -----------------

def per_token_losses(trainer, batch: dict) -> torch.Tensor:
    """-log p of each position's next token as TRL's compute_loss gets them (its fused LM head, use_cache off),
    fp32; zero where the next token is not a target. Index i belongs to the conversation of token i."""
    with torch.no_grad():
        out = trainer.model(**batch, use_cache=False, fused_lm_head=True)
    return -out.log_probs[0]


def isolation_holds(trainer, prepare=lambda batch: batch) -> tuple[bool, bool]:
    """(every other conversation's per-token losses are exactly equal, the changed one's differ) when one
    conversation in the middle of the micro-batch's flat row is reversed (same length, other tokens)."""
    rows = [dict(trainer.train_dataset[i]) for i in range(ROWS_PER_MICRO_BATCH)]
    lengths = rows[0]["seq_lengths"]
    j = len(lengths) // 2  # a conversation with others before and after it in the row
    start, end = sum(lengths[:j]), sum(lengths[:j + 1])
    changed = [dict(row) for row in rows]
    changed[0]["input_ids"] = (rows[0]["input_ids"][:start] + rows[0]["input_ids"][start:end][::-1]
                               + rows[0]["input_ids"][end:])
    before = per_token_losses(trainer, prepare(trainer.data_collator(rows)))
    after = per_token_losses(trainer, prepare(trainer.data_collator(changed)))
    others = torch.ones(before.shape[0], dtype=torch.bool)
    others[start:end] = False
    return torch.equal(before[others], after[others]), not torch.equal(before[~others], after[~others])


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_a_changed_conversation_leaves_every_other_loss_bitwise_equal(attn, packed):
    """sdpa and eager both build a block-diagonal causal mask from the position_ids (transformers'
    find_packed_sequence_indices, with no attention mask and no cache); torch.equal, not a tolerance."""
    packed.model.set_attn_implementation(attn)
    try:
        others_equal, changed_differs = isolation_holds(packed)
    finally:
        packed.model.set_attn_implementation("sdpa")
    assert changed_differs, "the change did not reach the changed conversation: the check proves nothing"
    assert others_equal, f"{attn}: changing one packed conversation changed the losses of others"


def test_the_isolation_check_fails_when_isolation_breaks(packed, monkeypatch):
    """The control: with the packed-sequence detection off (an attention ignoring position_ids), or with the
    position_ids dropped from the batch (a collator losing them), later conversations see the changed one."""
    assert isolation_holds(packed, prepare=without_position_ids)[0] is False
    without_packed_detection(monkeypatch)
    assert isolation_holds(packed)[0] is False


# ---- (b) parity: the same conversations padded and packed give the same token-weighted loss and gradients --------

# fp32 on CPU: padded and packed rows run the same arithmetic in other shapes, so the sums differ by rounding only.
# Measured on the 24 chats below (one step, 1,048 target tokens): 3.9e-8 relative on the loss, 1.9e-7 on the
# gradients (largest difference over the largest gradient). With the conversations attending to each other (the
# control): 3.4e-4 on the loss (an untrained model leans little on context) and 0.32 on the gradients.
LOSS_RTOL = 1e-6
GRAD_RTOL = 1e-5


def one_step(trainer, batches: list[dict]) -> tuple[int, float, torch.Tensor]:
    """(num_items_in_batch, loss, flat gradient) of one optimizer step over `batches` as Trainer runs it with
    gradient accumulation: the items counted over every micro-batch (Trainer.get_batch_samples), each micro-batch's
    loss summed over its tokens and divided by that count (SFTTrainer.compute_loss), gradients accumulated."""
    model = trainer.model
    model.train()
    model.zero_grad(set_to_none=True)
    samples, num_items = trainer.get_batch_samples(iter(batches), len(batches), torch.device("cpu"))
    total = 0.0
    for batch in samples:
        loss = trainer.compute_loss(model, dict(batch), num_items_in_batch=num_items)
        loss.backward()
        total += loss.item()
    grad = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    model.zero_grad(set_to_none=True)
    return int(num_items), total, grad


def relative(a, b) -> float:
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    return float((a - b).abs().max() / b.abs().max())


def test_packed_and_padded_train_the_same_token_weighted_loss(packed, padded, monkeypatch):
    padded_items, padded_loss, padded_grad = one_step(padded, micro_batches(padded, CHATS_PER_MICRO_BATCH))
    packed_batches = micro_batches(packed, ROWS_PER_MICRO_BATCH)
    packed_items, packed_loss, packed_grad = one_step(packed, packed_batches)
    # the same targets: each conversation's tokens after its first (padded rows shift them out, packed rows mask the
    # first token of each conversation), so TRL's normalisation divides by the same count
    assert packed_items == padded_items
    assert len(packed_batches) < len(micro_batches(padded, CHATS_PER_MICRO_BATCH))  # packing did pack
    assert relative(packed_loss, padded_loss) < LOSS_RTOL, (packed_loss, padded_loss)
    assert relative(packed_grad, padded_grad) < GRAD_RTOL

    # the control: the same packed step with the conversations attending to each other is far outside the tolerance
    # (broken at the attention: compute_loss counts the tokens from the position_ids, so the batch keeps them)
    without_packed_detection(monkeypatch)
    _, leaky_loss, leaky_grad = one_step(packed, packed_batches)
    assert relative(leaky_loss, padded_loss) > 100 * LOSS_RTOL, (leaky_loss, padded_loss)
    assert relative(leaky_grad, padded_grad) > 1000 * GRAD_RTOL
