"""The smoke profile's tiny model, tokenizer and dataset: built by our code, offline and deterministically.

Nothing here touches the network. The artefacts are cached under ``$RECIPES_CACHE`` (default
``~/.cache/llm-recipes``) in a folder named by the hash of ``SMOKE_SPEC``, so any change to the spec (or to
this builder, via ``BUILDER_VERSION``) builds a fresh copy instead of reusing a stale one.

The task is learnable so that the loss falls clearly within a few steps: the assistant sorts a short list of
number words that the user gives. A Qwen3 architecture with grouped-query attention (4 query heads, 2 KV heads)
keeps the head-count rules of sequence parallelism meaningful.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import tempfile
from pathlib import Path

BUILDER_VERSION = 1

SMOKE_SPEC = {
    "model": {
        "architecture": "Qwen3ForCausalLM",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "max_position_embeddings": 4096,
        "vocab_size": 64,
        "tie_word_embeddings": False,
        "init_seed": 1234,
    },
    "data": {"num_train": 512, "num_test": 32, "min_items": 3, "max_items": 12, "seed": 4321},
}

NUMBER_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
COMMAND_WORDS = ["sort", "these", "numbers", "sorted", ":", ","]
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ROLE_WORDS = ["system", "user", "assistant"]

# Qwen-style ChatML template; the {% generation %} markers let TRL's assistant_only_loss work with it too.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}"
    "{% else %}{{ message['content'] + '<|im_end|>' }}{% endif %}"
    "{{ '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def cache_root() -> Path:
    return Path(os.environ.get("RECIPES_CACHE", Path.home() / ".cache" / "llm-recipes"))


def spec_hash() -> str:
    blob = json.dumps({"spec": SMOKE_SPEC, "builder": BUILDER_VERSION}, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def smoke_dir() -> Path:
    return cache_root() / "smoke" / spec_hash()


def model_dir() -> Path:
    return smoke_dir() / "model"


def data_dir() -> Path:
    return smoke_dir() / "data"


def _vocabulary() -> list[str]:
    words = SPECIAL_TOKENS + ROLE_WORDS + COMMAND_WORDS + NUMBER_WORDS + ["<unk>"]
    return words


def build_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(_vocabulary())}
    assert len(vocab) <= SMOKE_SPEC["model"]["vocab_size"]
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<unk>",
        additional_special_tokens=["<|im_start|>"],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = SMOKE_SPEC["model"]["max_position_embeddings"]
    return fast


def build_model(tokenizer):
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    spec = dict(SMOKE_SPEC["model"])
    spec.pop("architecture")
    seed = spec.pop("init_seed")
    config = Qwen3Config(
        **spec,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        dtype="float32",
    )
    # transformers initialises weights from torch's global RNG; seed it inside fork_rng, which restores the caller's
    # RNG state afterwards, so that building the model neither depends on nor changes the global state.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return Qwen3ForCausalLM(config)


def build_examples(split: str = "train") -> list[dict]:
    spec = SMOKE_SPEC["data"]
    # The test split has its own stream, so adding it left the training examples unchanged.
    rng = random.Random(spec["seed"] if split == "train" else spec["seed"] + 1)
    examples = []
    for _ in range(spec[f"num_{split}"]):
        n = rng.randint(spec["min_items"], spec["max_items"])
        values = [rng.randrange(10) for _ in range(n)]
        question = "sort these numbers : " + " , ".join(NUMBER_WORDS[v] for v in values)
        answer = "sorted : " + " , ".join(NUMBER_WORDS[v] for v in sorted(values))
        examples.append(
            {"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]}
        )
    return examples


def _build_once(target: Path, prefix: str, write) -> None:
    """Build a folder once, whole or not at all: `write(tmp)` fills a temporary folder beside `target`, marked
    COMPLETE, then renamed to `target` in one step; a process that loses the race to another drops its copy (the
    two are identical: built by the same code from the same spec)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=target.parent))
    try:
        write(tmp)
        (tmp / "COMPLETE").write_text("")
        try:
            tmp.rename(target)
        except OSError:  # another process won the race; its copy is identical
            shutil.rmtree(tmp, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def ensure_smoke_assets(progress=print) -> dict[str, str]:
    """Build (once) and return the paths of the smoke model and dataset."""
    target = smoke_dir()
    if not (target / "COMPLETE").exists():
        progress(f"building the smoke model and dataset in {target} (offline, deterministic)")

        def write(tmp: Path) -> None:
            tokenizer = build_tokenizer()
            model = build_model(tokenizer)
            model.save_pretrained(tmp / "model", safe_serialization=True)
            tokenizer.save_pretrained(tmp / "model")
            (tmp / "data").mkdir()
            for split in ("train", "test"):
                with open(tmp / "data" / f"{split}.jsonl", "w") as f:
                    for ex in build_examples(split):
                        f.write(json.dumps(ex) + "\n")
            (tmp / "spec.json").write_text(json.dumps(SMOKE_SPEC, indent=2))

        _build_once(target, ".build-", write)
    return {"model": str(model_dir()), "data": str(data_dir())}


def bf16_model_dir() -> Path:
    return smoke_dir() / "model-bf16"


def ensure_bf16_model(progress=print) -> str:
    """Build (once) and return a copy of the smoke model whose weights are stored in bf16: what a bf16 smoke run
    loads (launch.config.profiles), as real checkpoints are bf16. A run that loads it in fp32 (the ddp recipe's
    fp32 masters) and one that loads it in bf16 (ZeRO, FSDP2) then start from the same weights; from the fp32 smoke
    model they would not (bf16 rounds them). Same tokenizer and config, `dtype` bfloat16."""
    target = bf16_model_dir()
    if (target / "COMPLETE").exists():
        return str(target)
    import torch
    from safetensors.torch import load_file, save_file

    source = Path(ensure_smoke_assets(progress=progress)["model"])
    progress(f"writing the smoke model's bf16 copy in {target}")

    def write(tmp: Path) -> None:
        for f in source.iterdir():
            if f.suffix == ".safetensors":
                save_file({k: v.to(torch.bfloat16) for k, v in load_file(f).items()}, tmp / f.name,
                          metadata={"format": "pt"})
            elif f.name == "config.json":
                config = json.loads(f.read_text())
                (tmp / f.name).write_text(json.dumps({**config, "dtype": "bfloat16"}, indent=2))
            else:
                shutil.copy2(f, tmp / f.name)

    _build_once(target, ".build-bf16-", write)
    return str(target)

if __name__ == "__main__":
    print(json.dumps(ensure_smoke_assets(), indent=2))
