"""The zoo's workloads: models of the families users bring to kiln, each at a size realistic for one GPU, with
random weights (nothing is downloaded).

A workload is a model, a task and a precision:
- `train`: one training step in bf16 autocast with AdamW; the compiled module returns the loss.
- `infer`: one forward under `torch.no_grad()`, with the model's weights in the workload's dtype.

Each builder takes the batch size, the device and whether it trains, and returns `(module, make_inputs)`, where
`make_inputs(generator)` draws a fresh tuple of positional inputs on the device. Models whose library is missing
are reported as skipped, not failed.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from torch import nn


@dataclasses.dataclass(frozen=True)
class Workload:
    """One (model, task, precision, batch) the zoo runs."""

    name: str
    family: str
    build: Callable[[int, torch.device, bool], tuple[nn.Module, Callable]]  # (batch, device, train)
    task: str  # "train" or "infer"
    dtype: torch.dtype
    batch: int


class ClassifierLoss(nn.Module):
    """A vision classifier with its cross-entropy loss, so that the compiled module returns the loss as the
    Hugging Face models do when given labels."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, images, labels=None):
        logits = self.model(images)
        if labels is None:
            return logits
        return nn.functional.cross_entropy(logits, labels)


def _token_inputs(batch: int, seq: int, vocab: int, device, labels: bool):
    def make(gen):
        ids = torch.randint(0, vocab, (batch, seq), generator=gen).to(device)
        return (ids, ids) if labels else (ids,)
    return make


class _HFCausal(nn.Module):
    """A Hugging Face model called positionally: (input_ids[, labels]) -> loss or logits. Without labels an
    encoder-decoder's decoder reads the same tokens (T5 does not derive its decoder inputs itself)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, labels=None):
        if labels is None and self.model.config.is_encoder_decoder:
            return self.model(input_ids=input_ids, decoder_input_ids=input_ids).logits
        out = self.model(input_ids=input_ids, labels=labels)
        return out.loss if labels is not None else out.logits


def hf_lm(config_name: str, seq: int, **config):
    """A builder for a transformers model made from its config class with `config` (a decoder LM, a masked LM or a
    seq2seq LM, chosen by `config_name`'s auto class)."""
    def build(batch: int, device, train: bool):
        import transformers

        auto, cls_name = _HF_CONFIGS[config_name]
        cfg = getattr(transformers, cls_name)(**config)
        cfg.use_cache = False
        model = getattr(transformers, auto).from_config(cfg)
        return _HFCausal(model).to(device), _token_inputs(batch, seq, cfg.vocab_size, device, labels=train)
    return build


_HF_CONFIGS = {
    "llama": ("AutoModelForCausalLM", "LlamaConfig"),
    "mistral": ("AutoModelForCausalLM", "MistralConfig"),
    "qwen2": ("AutoModelForCausalLM", "Qwen2Config"),
    "phi3": ("AutoModelForCausalLM", "Phi3Config"),
    "gpt_neox": ("AutoModelForCausalLM", "GPTNeoXConfig"),
    "opt": ("AutoModelForCausalLM", "OPTConfig"),
    "gpt2": ("AutoModelForCausalLM", "GPT2Config"),
    "bert": ("AutoModelForMaskedLM", "BertConfig"),
    "roberta": ("AutoModelForMaskedLM", "RobertaConfig"),
    "deberta_v2": ("AutoModelForMaskedLM", "DebertaV2Config"),
    "distilbert": ("AutoModelForMaskedLM", "DistilBertConfig"),
    "t5": ("AutoModelForSeq2SeqLM", "T5Config"),
    "bart": ("AutoModelForSeq2SeqLM", "BartConfig"),
}


class _Whisper(nn.Module):
    """Whisper called positionally: (input_features, decoder_input_ids[, labels])."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, features, decoder_ids, labels=None):
        out = self.model(input_features=features, decoder_input_ids=decoder_ids, labels=labels)
        return out.loss if labels is not None else out.logits


def whisper(frames: int = 3000, target: int = 128):
    """A Whisper-base-sized speech model over `frames` mel frames and `target` decoder tokens."""
    def build(batch: int, device, train: bool):
        import transformers

        cfg = transformers.WhisperConfig(d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8,
                                         decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048,
                                         max_source_positions=frames // 2, use_cache=False)
        model = _Whisper(transformers.WhisperForConditionalGeneration(cfg)).to(device)

        def make(gen):
            features = torch.randn(batch, cfg.num_mel_bins, frames, generator=gen).to(device)
            ids = torch.randint(0, cfg.vocab_size, (batch, target), generator=gen).to(device)
            return (features, ids, ids) if train else (features, ids)
        return model, make
    return build


def vision(library: str, model_name: str, size: int = 224, classes: int = 1000):
    """A builder for a timm or torchvision classifier at `size`x`size` images."""
    def build(batch: int, device, train: bool):
        if library == "timm":
            import timm
            net = timm.create_model(model_name, pretrained=False, num_classes=classes)
        else:
            import torchvision
            net = getattr(torchvision.models, model_name)(weights=None, num_classes=classes)

        def make(gen):
            images = torch.randn(batch, 3, size, size, generator=gen).to(device)
            if not train:
                return (images,)
            return images, torch.randint(0, classes, (batch,), generator=gen).to(device)
        return ClassifierLoss(net).to(device), make
    return build


# Decoder sizes: a ~110-150M parameter model (GPT-2-small-like) at sequence 512, the Llama-style one at 1024.
_DECODER = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=2048,
                vocab_size=32000, max_position_embeddings=2048)
_ENCODER = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                vocab_size=30522, max_position_embeddings=512)

MODELS = {
    "llama": ("hf-decoder", hf_lm("llama", 1024, **_DECODER, num_key_value_heads=4), 8),
    "mistral": ("hf-decoder", hf_lm("mistral", 512, **_DECODER, num_key_value_heads=4, sliding_window=None), 8),
    "qwen2": ("hf-decoder", hf_lm("qwen2", 512, **_DECODER, num_key_value_heads=4), 8),
    "phi3": ("hf-decoder", hf_lm("phi3", 512, **_DECODER, pad_token_id=0, bos_token_id=1, eos_token_id=2), 8),
    "gpt_neox": ("hf-decoder", hf_lm("gpt_neox", 512, **_DECODER), 8),
    "opt": ("hf-decoder", hf_lm("opt", 512, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                                ffn_dim=3072, vocab_size=50272, max_position_embeddings=2048,
                                word_embed_proj_dim=768), 8),
    "gpt2": ("hf-decoder", hf_lm("gpt2", 512, n_embd=768, n_layer=12, n_head=12, vocab_size=50257,
                                 n_positions=1024), 8),
    "bert": ("hf-encoder", hf_lm("bert", 512, **_ENCODER), 16),
    "roberta": ("hf-encoder", hf_lm("roberta", 512, **{**_ENCODER, "max_position_embeddings": 514}), 16),
    "deberta_v2": ("hf-encoder", hf_lm("deberta_v2", 512, **_ENCODER), 8),
    "distilbert": ("hf-encoder", hf_lm("distilbert", 512, dim=768, n_layers=6, n_heads=12, hidden_dim=3072,
                                       vocab_size=30522), 16),
    "t5": ("hf-seq2seq", hf_lm("t5", 512, d_model=512, d_ff=2048, num_layers=6, num_heads=8, vocab_size=32128,
                               decoder_start_token_id=0), 8),
    "bart": ("hf-seq2seq", hf_lm("bart", 512, d_model=768, encoder_layers=6, decoder_layers=6,
                                 encoder_attention_heads=12, decoder_attention_heads=12, vocab_size=50265), 8),
    "whisper": ("hf-seq2seq", whisper(), 8),
    "timm_vit": ("timm", vision("timm", "vit_base_patch16_224"), 64),
    "timm_deit": ("timm", vision("timm", "deit_small_patch16_224"), 64),
    "timm_swin": ("timm", vision("timm", "swin_tiny_patch4_window7_224"), 64),
    "timm_convnext": ("timm", vision("timm", "convnext_tiny"), 64),
    "timm_efficientnet": ("timm", vision("timm", "efficientnet_b0"), 64),
    "timm_mobilenetv3": ("timm", vision("timm", "mobilenetv3_large_100"), 64),
    "timm_resnet": ("timm", vision("timm", "resnet50"), 64),
    "timm_regnet": ("timm", vision("timm", "regnety_016"), 64),
    "tv_resnet": ("torchvision", vision("torchvision", "resnet50"), 64),
    "tv_densenet": ("torchvision", vision("torchvision", "densenet121"), 64),
    "tv_mobilenet": ("torchvision", vision("torchvision", "mobilenet_v3_large"), 64),
}

# Inference runs on a representative model per family, in bf16 at the training batch and in fp32 at batch 1
# (latency) and at the training batch (throughput).
_INFERENCE = {
    "llama": [(torch.bfloat16, None), (torch.float32, 1)],
    "gpt2": [(torch.float32, None)],
    "bert": [(torch.bfloat16, None), (torch.float32, 1)],
    "t5": [(torch.bfloat16, None)],
    "timm_vit": [(torch.bfloat16, None), (torch.float32, 1)],
    "timm_convnext": [(torch.float32, None)],
    "tv_resnet": [(torch.bfloat16, 1), (torch.float32, None)],
    "timm_swin": [(torch.float32, None)],
}

_DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float32: "fp32"}


def _all_workloads() -> dict[str, Workload]:
    found = {}
    for name, (family, build, batch) in MODELS.items():
        found[f"{name}_train_bf16"] = Workload(f"{name}_train_bf16", family, build, "train", torch.bfloat16, batch)
        for dtype, infer_batch in _INFERENCE.get(name, ()):
            b = infer_batch or batch
            label = f"{name}_infer_{_DTYPE_NAMES[dtype]}_bs{b}"
            found[label] = Workload(label, family, build, "infer", dtype, b)
    return found


WORKLOADS = _all_workloads()


def gpu_settings() -> None:
    """The backend switches every compiler's run of a workload shares: TF32 matmuls and convolutions, and cuDNN's
    search for the fastest convolution algorithm (paid in each compiler's first step)."""
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cudnn.benchmark = True


def without_dropout(model: torch.nn.Module) -> None:
    """Turn every dropout off (modules and the float `*dropout*` attributes attention layers read), so that a
    compiled step and an eager step draw no random numbers and their losses compare exactly."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        for name, value in list(vars(module).items()):
            if "dropout" in name and isinstance(value, float):
                setattr(module, name, 0.0)


def make_step(workload, fn, model):
    """One step of the workload through `fn`: forward (and for training backward and AdamW) -> a result tensor."""
    if workload.task == "infer":
        def infer(inputs):
            with torch.no_grad():
                out = fn(*inputs)
            return out
        return infer
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def train(inputs):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fn(*inputs)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()
    return train
