"""The model's architecture as the memory model needs it, read from its config (transformers' `AutoConfig` or a
config.json dict)."""

from __future__ import annotations

from dataclasses import dataclass

from launch.errors import LaunchError

# The nn.Linear modules of one decoder layer of transformers' Llama-style families (LlamaAttention / Qwen2Attention /
# Qwen3Attention / MistralAttention: `self_attn.{q,k,v,o}_proj`; LlamaMLP and kin: `mlp.{gate,up,down}_proj`), with
# their parent module: the layer the memory model describes. `launch.memory.plan` checks a model's real layer
# (launch.facts.meta_model) against these names before planning it.
LAYER_LINEARS = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
                 "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}
OUTPUT_LAYER = "lm_head"


def linear_module_names(num_layers: int) -> list[str]:
    """Every nn.Linear's full module name in `AutoModelForCausalLM` of a Llama-style family
    (`model.layers.N.self_attn.q_proj`, ..., `lm_head`)."""
    names = [f"model.layers.{n}.{parent}.{suffix}" for n in range(num_layers)
             for suffix, parent in LAYER_LINEARS.items()]
    return names + [OUTPUT_LAYER]


# What the memory model reads from every config (head_dim, num_key_value_heads and the rest have defaults)
REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")


def _get(config, key, default=None):
    if isinstance(config, dict):
        return config.get(key, default)
    return getattr(config, key, default)


@dataclass(frozen=True)
class Architecture:
    """A decoder-only dense transformer (Llama / Qwen2 / Qwen3 / Mistral style): RMSNorm, GQA attention with RoPE,
    SiLU-gated MLP (gate, up, down), an LM head tied to the embeddings or not."""

    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    attention_bias: bool = False  # bias on q/k/v projections (Qwen2)
    qk_norm: bool = False  # RMSNorm on q and k per head (Qwen3)
    model_type: str = "llama"

    @classmethod
    def from_config(cls, config) -> "Architecture":
        """From a transformers `PretrainedConfig` (its text config is used) or a dict of `config.json`.

        `head_dim` defaults to hidden / heads; `num_key_value_heads` to the head count; `tie_word_embeddings` to False
        (the default of LlamaConfig, Qwen2Config, Qwen3Config, MistralConfig). Qwen2 has q/k/v biases
        (`Qwen2Attention`), Qwen3 has q/k norms (`Qwen3Attention.q_norm/k_norm`).
        """
        if not isinstance(config, dict) and hasattr(config, "get_text_config"):
            config = config.get_text_config()
        elif isinstance(config, dict) and isinstance(config.get("text_config"), dict):
            config = config["text_config"]
        # a transformers config answers the names below through its attribute_map (GPT-2's n_embd is hidden_size)
        missing = [k for k in REQUIRED if _get(config, k) is None]
        if missing:
            raise LaunchError(
                f"The memory model needs {', '.join(missing)} from the model's config, which this "
                f"{_get(config, 'model_type', 'model')} config does not give: it describes Llama-style decoders "
                "(Llama, Mistral, Qwen2, Qwen3). Plan a model of such a family, or give those fields in its "
                "config.json.")
        hidden = int(_get(config, "hidden_size"))
        heads = int(_get(config, "num_attention_heads"))
        kv = _get(config, "num_key_value_heads") or heads
        head_dim = _get(config, "head_dim") or hidden // heads
        model_type = str(_get(config, "model_type", "llama") or "llama")
        bias = _get(config, "attention_bias")
        if bias is None:
            bias = model_type == "qwen2"
        return cls(
            hidden_size=hidden,
            num_layers=int(_get(config, "num_hidden_layers")),
            num_attention_heads=heads,
            num_key_value_heads=int(kv),
            head_dim=int(head_dim),
            intermediate_size=int(_get(config, "intermediate_size")),
            vocab_size=int(_get(config, "vocab_size")),
            tie_word_embeddings=bool(_get(config, "tie_word_embeddings", False)),
            attention_bias=bool(bias) or model_type == "qwen2",
            qk_norm=model_type in ("qwen3",),
            model_type=model_type,
        )

    # ---- shapes
    @property
    def q_dim(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_key_value_heads * self.head_dim

    # ---- linear layers (what LoRA targets and bitsandbytes quantizes)
    def linear_layers(self) -> dict[str, tuple[str, int, int]]:
        """The nn.Linear modules of one decoder layer: suffix -> (parent path, in_features, out_features), as the
        transformers modules of the dense families name them (LlamaAttention / Qwen2Attention / Qwen3Attention /
        MistralAttention: `self_attn.{q,k,v,o}_proj`; LlamaMLP and kin: `mlp.{gate,up,down}_proj`)."""
        h, q, kv, i = self.hidden_size, self.q_dim, self.kv_dim, self.intermediate_size
        return {"q_proj": ("self_attn", h, q), "k_proj": ("self_attn", h, kv), "v_proj": ("self_attn", h, kv),
                "o_proj": ("self_attn", q, h), "gate_proj": ("mlp", h, i), "up_proj": ("mlp", h, i),
                "down_proj": ("mlp", i, h)}

    def linear_module_names(self) -> list[str]:
        """Every nn.Linear's full module name (`linear_module_names`): what LoRA targets match."""
        return linear_module_names(self.num_layers)

    # ---- parameter counts
    @property
    def attention_matmul_params_per_layer(self) -> int:
        """q, k, v and o projections."""
        h, q, kv = self.hidden_size, self.q_dim, self.kv_dim
        return h * q + 2 * h * kv + q * h

    @property
    def attention_params_per_layer(self) -> int:
        q, kv = self.q_dim, self.kv_dim
        n = self.attention_matmul_params_per_layer
        if self.attention_bias:
            n += q + 2 * kv
        if self.qk_norm:
            n += 2 * self.head_dim
        return n

    @property
    def mlp_params_per_layer(self) -> int:
        return 3 * self.hidden_size * self.intermediate_size

    @property
    def params_per_layer(self) -> int:
        """One decoder layer: attention q/k/v/o (+ biases, + q/k norms), MLP gate/up/down, two RMSNorm weights."""
        return self.attention_params_per_layer + self.mlp_params_per_layer + 2 * self.hidden_size

    @property
    def matmul_params_per_layer(self) -> int:
        return self.attention_matmul_params_per_layer + self.mlp_params_per_layer

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        """The LM head's weight (shared with the embeddings when tied: counted once in `num_params`)."""
        return self.vocab_size * self.hidden_size

    @property
    def num_params(self) -> int:
        """Embeddings + layers + final norm + LM head unless tied."""
        n = self.embedding_params + self.num_layers * self.params_per_layer + self.hidden_size
        if not self.tie_word_embeddings:
            n += self.lm_head_params
        return n

    @property
    def matmul_params(self) -> int:
        """N for MFU (torchtitan's convention): all parameters minus the embedding table, i.e. the layers' matrices,
        norms and an untied LM head. FLOPs/token = 6 N + 12 L heads head_dim seq (state causal discount or not)."""
        return self.num_params - self.embedding_params

    @property
    def small_params(self) -> int:
        """Parameters below DeepSpeed's `stage3_param_persistence_threshold` (1e5): norms, biases, q/k norms. ZeRO-3
        keeps these whole on every rank."""
        per_layer = 2 * self.hidden_size + (2 * self.head_dim if self.qk_norm else 0)
        if self.attention_bias:
            per_layer += self.q_dim + 2 * self.kv_dim
        return self.num_layers * per_layer + self.hidden_size
