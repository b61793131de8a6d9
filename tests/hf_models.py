"""Public model architectures nobody here wrote: Hugging Face transformers' own PyTorch modules
(vision CNNs, vision transformers, hybrids, text encoders, a speech encoder), built from small configs
(EfficientNet from its default one: 64M parameters, 550 kernel calls) with random weights, so no
download is needed.

`build(name)` returns (model in eval mode, example inputs). Every parameter is drawn from a normal
distribution scaled by its fan-in, and batch norms get random statistics: with transformers' own
initialisation several of these networks (EfficientNet, MobileViT) output exactly zero, and a
comparison with zero proves nothing.

Needs torch and transformers (optional: `pip install -e ".[hf]"`).
"""

from __future__ import annotations

import torch
import transformers as hf

SIZE = 64  # 1 x 3 x 64 x 64 images; 16 tokens of text; 4000 audio samples

#: name -> (config class, model class, config arguments, input kind)
ARCHITECTURES = {
    "resnet": (hf.ResNetConfig, hf.ResNetModel, dict(embedding_size=16, hidden_sizes=[16, 32, 64, 128],
                                                     depths=[1, 1, 1, 1]), "image"),
    "resnet-bottleneck": (hf.ResNetConfig, hf.ResNetModel, dict(
        embedding_size=16, hidden_sizes=[32, 64, 128, 256], depths=[1, 1, 1, 1], layer_type="bottleneck"), "image"),
    "convnext": (hf.ConvNextConfig, hf.ConvNextModel, dict(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1]),
                 "image"),
    "convnextv2": (hf.ConvNextV2Config, hf.ConvNextV2Model, dict(hidden_sizes=[16, 32, 64, 128],
                                                                 depths=[1, 1, 1, 1]), "image"),
    "efficientnet": (hf.EfficientNetConfig, hf.EfficientNetModel, dict(image_size=SIZE), "image"),
    "mobilenet_v1": (hf.MobileNetV1Config, hf.MobileNetV1Model, dict(image_size=SIZE, depth_multiplier=0.25),
                     "image"),
    "mobilenet_v2": (hf.MobileNetV2Config, hf.MobileNetV2Model, dict(image_size=SIZE, depth_multiplier=0.35),
                     "image"),
    "regnet": (hf.RegNetConfig, hf.RegNetModel, dict(embedding_size=16, hidden_sizes=[16, 32, 64, 128],
                                                     depths=[1, 1, 1, 1], groups_width=8), "image"),
    "bit": (hf.BitConfig, hf.BitModel, dict(embedding_size=32, hidden_sizes=[32, 64, 128, 256], depths=[1, 1, 1, 1],
                                            num_groups=8), "image"),
    "poolformer": (hf.PoolFormerConfig, hf.PoolFormerModel, dict(hidden_sizes=[16, 32, 64, 128],
                                                                 depths=[1, 1, 1, 1]), "image"),
    "mobilevit": (hf.MobileViTConfig, hf.MobileViTModel, dict(
        image_size=SIZE, hidden_sizes=[32, 48, 64], neck_hidden_sizes=[8, 16, 24, 24, 32, 40, 64]), "image"),
    "vit": (hf.ViTConfig, hf.ViTModel, dict(image_size=SIZE, patch_size=16, hidden_size=64, num_hidden_layers=2,
                                            num_attention_heads=4, intermediate_size=128), "image"),
    "swin": (hf.SwinConfig, hf.SwinModel, dict(image_size=SIZE, patch_size=4, embed_dim=16, depths=[1, 1],
                                               num_heads=[2, 4], window_size=4), "image"),
    "segformer": (hf.SegformerConfig, hf.SegformerModel, dict(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1],
                                                              decoder_hidden_size=64), "image"),
    "levit": (hf.LevitConfig, hf.LevitModel, dict(image_size=SIZE, hidden_sizes=[32, 64, 96],
                                                  num_attention_heads=[2, 2, 2], depths=[1, 1, 1],
                                                  key_dim=[8, 8, 8]), "image"),
    "bert": (hf.BertConfig, hf.BertModel, dict(vocab_size=100, hidden_size=64, num_hidden_layers=2,
                                               num_attention_heads=4, intermediate_size=128), "text"),
    # conv1d: SqueezeBERT's dense layers (grouped 1x1), Wav2Vec2's strided feature extractor and
    # grouped positional conv, Mamba's depthwise causal conv (normalise/conv1ds.py)
    "squeezebert": (hf.SqueezeBertConfig, hf.SqueezeBertModel, dict(
        vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        embedding_size=64, q_groups=2, k_groups=2, v_groups=2, post_attention_groups=2, intermediate_groups=4,
        output_groups=4), "text"),
    "wav2vec2": (hf.Wav2Vec2Config, hf.Wav2Vec2Model, dict(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, conv_dim=(32, 32, 32),
        conv_stride=(5, 2, 2), conv_kernel=(10, 3, 3), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4),
                 "audio"),
    "mamba": (hf.MambaConfig, hf.MambaModel, dict(vocab_size=100, hidden_size=64, state_size=8, num_hidden_layers=2,
                                                  expand=2, conv_kernel=4, use_cache=False), "text"),
    # decoders: their causal-mask code's bool cumsum (normalise/bool_scans.py) built for no target before
    "gpt2": (hf.GPT2Config, hf.GPT2Model, dict(vocab_size=100, n_embd=64, n_layer=2, n_head=4, n_positions=64,
                                               use_cache=False), "text"),
    "llama": (hf.LlamaConfig, hf.LlamaModel, dict(vocab_size=100, hidden_size=64, num_hidden_layers=2,
                                                  num_attention_heads=4, intermediate_size=128, num_key_value_heads=2,
                                                  use_cache=False), "text"),
    # Bloom: ALiBi and its own tanh GELU; Falcon: multi-query attention, whose qkv[..., [-2], :]
    # read before the tensor until normalise/negative_indices.py
    "bloom": (hf.BloomConfig, hf.BloomModel, dict(vocab_size=100, hidden_size=64, n_layer=2, n_head=4,
                                                  use_cache=False), "text"),
    "falcon": (hf.FalconConfig, hf.FalconModel, dict(vocab_size=100, hidden_size=64, num_hidden_layers=2,
                                                     num_attention_heads=4, multi_query=True, use_cache=False), "text"),
}


def build(name: str, seed: int = 0):
    """(model, inputs): the architecture with random weights in eval mode, and example inputs."""
    config_class, model_class, arguments, kind = ARCHITECTURES[name]
    model = randomised(model_class(config_class(**arguments)), seed)
    inputs = {"image": lambda: (torch.randn(1, 3, SIZE, SIZE),), "text": lambda: (torch.randint(0, 100, (1, 16)),),
              "audio": lambda: (torch.randn(1, 4000),)}[kind]()
    return model, inputs


def randomised(model, seed: int = 0):
    """`model` in eval mode with every parameter drawn from a normal distribution scaled by its
    fan-in and random batch-norm statistics (seeded)."""
    torch.manual_seed(seed)
    model = model.eval()
    with torch.no_grad():
        for param in model.parameters():  # scaled by fan-in (a weight's row), so activations stay O(1)
            param.normal_(0, 1 / param[0].numel() ** 0.5 if param.dim() > 1 else 0.5)
        for buffer_name, buffer in model.named_buffers():
            if buffer_name.endswith("running_var"):
                buffer.uniform_(0.5, 1.5)
            elif buffer_name.endswith("running_mean"):
                buffer.normal_(0, 0.1)
    return model


def first_output(output):
    """The model's main output tensor (last_hidden_state), from a ModelOutput, a tuple or a tensor
    (PyTorch's side) or a TVM tuple / tensor (the VM's side)."""
    if hasattr(output, "last_hidden_state"):
        return output.last_hidden_state
    while isinstance(output, (tuple, list)) or (not hasattr(output, "numpy") and hasattr(output, "__getitem__")):
        output = output[0]
    return output
