"""Transformer architectures nobody here wrote: Hugging Face transformers' own PyTorch modules for
the families issue 34 names (decoder LLMs with RMSNorm, RoPE, grouped-query attention and SwiGLU;
GPT-2, GPT-J, GPT-NeoX, Bloom and Falcon styles; BERT, RoBERTa, ALBERT, DistilBERT and T5
encoders; ViT, DeiT, DINOv2, CLIP, Swin; a Whisper-style audio encoder; ConvNeXt), each from a
small config (hidden size 64, 2 layers, 4 heads) with random weights, so no download is needed.

`build(name, tokens=16)` returns (model in eval mode, example inputs). Decoders get an explicit
all-ones attention mask as their second input (`.model` is the decoder itself: given `input_ids`
alone and a symbolic length, it compiles too since normalise/bounded_shapes.py,
test_symbolic_exports.py).

Needs torch and transformers (optional: `pip install -e ".[hf]"`).
"""

from __future__ import annotations

import torch
import transformers as hf
from transformers.models.whisper import modeling_whisper

from hf_models import first_output, randomised  # noqa: F401  (first_output: the tests and the benchmark read outputs with it)

IMAGE = 64  # 1 x 3 x 64 x 64 images
VOCAB = 100
SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
DECODER = dict(vocab_size=VOCAB, max_position_embeddings=256, use_cache=False, **SMALL)

#: name -> (config class, model class, config arguments, input kind)
ARCHITECTURES = {
    # decoders: RMSNorm, rotary embeddings, grouped-query attention (2 KV heads), SwiGLU
    "llama": (hf.LlamaConfig, hf.LlamaModel, dict(num_key_value_heads=2, **DECODER), "decoder"),
    "qwen2": (hf.Qwen2Config, hf.Qwen2Model, dict(num_key_value_heads=2, **DECODER), "decoder"),
    "mistral": (hf.MistralConfig, hf.MistralModel, dict(num_key_value_heads=2, sliding_window=None, **DECODER),
                "decoder"),
    "gemma": (hf.GemmaConfig, hf.GemmaModel, dict(num_key_value_heads=1, head_dim=16, **DECODER), "decoder"),
    "phi3": (hf.Phi3Config, hf.Phi3Model, dict(num_key_value_heads=2, pad_token_id=0, bos_token_id=0,
                                                  eos_token_id=0, **DECODER), "decoder"),
    # GPT styles: learned positions and NewGELU (GPT-2), partial rotary and a parallel block (GPT-J,
    # GPT-NeoX), ALiBi and Bloom's GELU, multi-query attention (Falcon)
    "gpt2": (hf.GPT2Config, hf.GPT2Model, dict(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=256,
                                               bos_token_id=0, eos_token_id=0, use_cache=False), "decoder"),
    "gptj": (hf.GPTJConfig, hf.GPTJModel, dict(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=256,
                                               rotary_dim=8, bos_token_id=0, eos_token_id=0, use_cache=False),
             "decoder"),
    "gpt_neox": (hf.GPTNeoXConfig, hf.GPTNeoXModel, dict(rotary_pct=0.5, **DECODER), "decoder"),
    "bloom": (hf.BloomConfig, hf.BloomModel, dict(vocab_size=VOCAB, hidden_size=64, n_layer=2, n_head=4,
                                                  use_cache=False), "decoder"),
    "falcon": (hf.FalconConfig, hf.FalconModel, dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2,
                                                     num_attention_heads=4, multi_query=True, new_decoder_architecture=False,
                                                     use_cache=False), "decoder"),
    # encoders
    "bert": (hf.BertConfig, hf.BertModel, dict(vocab_size=VOCAB, **SMALL), "text"),
    "roberta": (hf.RobertaConfig, hf.RobertaModel, dict(vocab_size=VOCAB, pad_token_id=1, **SMALL), "text"),
    "albert": (hf.AlbertConfig, hf.AlbertModel, dict(vocab_size=VOCAB, embedding_size=32, **SMALL), "text"),
    "distilbert": (hf.DistilBertConfig, hf.DistilBertModel, dict(vocab_size=VOCAB, dim=64, n_layers=2, n_heads=4,
                                                                 hidden_dim=128), "text"),
    "t5": (hf.T5Config, hf.T5EncoderModel, dict(vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2,
                                                num_heads=4, feed_forward_proj="gated-gelu"), "text"),
    # vision
    "vit": (hf.ViTConfig, hf.ViTModel, dict(image_size=IMAGE, patch_size=16, **SMALL), "image"),
    "deit": (hf.DeiTConfig, hf.DeiTModel, dict(image_size=IMAGE, patch_size=16, **SMALL), "image"),
    "dinov2": (hf.Dinov2Config, hf.Dinov2Model, dict(image_size=IMAGE, patch_size=16, mlp_ratio=2,
                                                     hidden_size=64, num_hidden_layers=2, num_attention_heads=4),
               "image"),
    "clip": (hf.CLIPVisionConfig, hf.CLIPVisionModel, dict(image_size=IMAGE, patch_size=16, **SMALL), "image"),
    "swin": (hf.SwinConfig, hf.SwinModel, dict(image_size=IMAGE, patch_size=4, embed_dim=16, depths=[1, 1],
                                               num_heads=[2, 4], window_size=4), "image"),
    "convnext": (hf.ConvNextConfig, hf.ConvNextModel, dict(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1]),
                 "image"),
    # audio: Whisper's encoder over 80 mel bins x 2 * max_source_positions frames
    "whisper": (hf.WhisperConfig, modeling_whisper.WhisperEncoder, dict(
        d_model=64, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=128, num_mel_bins=80,
        max_source_positions=32), "audio"),
}


#: Swin-T's and ConvNeXt-T's published widths, heads and window at 224 x 224 px, one block a stage
#: (bench_transformers --published). The small configs above are narrower than any released model:
#: Swin's and ConvNeXt's first stage of 16 channels does 16 MACs a GELU where Swin-T's 96 do 96, so
#: on cgra-8x8 (64 MACs and one function-unit GELU a cycle) their cycles move from the PE array to
#: the vector unit; these measure the same architectures where the PE array does the work.
PUBLISHED = {
    "swin-t": (hf.SwinConfig, hf.SwinModel, dict(image_size=224, patch_size=4, embed_dim=96, depths=[1, 1, 1, 1],
                                                 num_heads=[3, 6, 12, 24], window_size=7), "image"),
    "convnext-t": (hf.ConvNextConfig, hf.ConvNextModel, dict(image_size=224, hidden_sizes=[96, 192, 384, 768],
                                                             depths=[1, 1, 1, 1]), "image"),
}

def build(name: str, tokens: int = 16, seed: int = 0):
    """(model, inputs): the architecture with random weights in eval mode, and example inputs
    (`tokens` tokens of text for the text models); `name` from ARCHITECTURES or PUBLISHED."""
    config_class, model_class, arguments, kind = {**ARCHITECTURES, **PUBLISHED}[name]
    image = arguments.get("image_size", IMAGE)
    model = randomised(model_class(config_class(**arguments)), seed)
    ids = torch.randint(0, VOCAB, (1, tokens))
    inputs = {"image": lambda: (torch.randn(1, 3, image, image),),
              "text": lambda: (ids,),
              "decoder": lambda: (ids, torch.ones(1, tokens, dtype=torch.int64)),
              "audio": lambda: (torch.randn(1, 80, 2 * arguments["max_source_positions"]),)}[kind]()
    return (WithMask(model) if kind == "decoder" else model), inputs


class WithMask(torch.nn.Module):
    """A decoder called as `model(input_ids=ids, attention_mask=mask)` (GPT-2's, GPT-J's and
    Falcon's second positional parameter is the KV cache, not the mask)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


#: Host operators that only move or re-view data: not counted as host compute.
LAYOUT_OPS = frozenset({"reshape", "expand_dims", "squeeze", "flatten", "permute_dims", "strided_slice", "split",
                        "concat", "broadcast_to", "repeat", "tile", "take", "view"})


#: Of those, the ones the VM runs as views (vm.builtin.reshape: the same memory, no copy), which are
#: no host call and no crossing (npu_backend/device/host_calls.py): not counted at all.
VIEW_OPS = frozenset({"reshape", "expand_dims", "squeeze", "flatten", "view"})


def host_op_counts(placements) -> tuple[int, int, list[str]]:
    """(compute ops on the host, layout copies and lookups on the host (views not counted), the
    compute ops' names)."""
    host = [p.op.split(".")[-1] for p in placements if p.where == "host"]
    compute = [p.op for p in placements if p.where == "host" and p.op.split(".")[-1] not in LAYOUT_OPS]
    layout = sum(1 for op in host if op in LAYOUT_OPS and op not in VIEW_OPS)
    return len(compute), layout, compute

