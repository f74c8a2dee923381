"""The Hugging Face architectures of the zoo (tests/e2e/hf_zoo.py): a tiny config and random inputs for each.

A config is the class's default config shrunk by one generic rule table (`SMALL`: any attribute the default
config has, in any nested sub-config, takes the small value), plus the few per-architecture overrides a model
needs to stay consistent (`Arch.config`). Dropout is off so that compiled and eager runs draw no random numbers
and compare exactly; token ids outside the shrunk vocabulary are moved inside it.

Inputs depend on the architecture's kind (`INPUTS`): a training step passes labels (or `return_loss=True`) so
that the model computes its own loss; inference passes none (encoder-decoders get `decoder_input_ids`).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import transformers

VOCAB, BATCH, SEQ, IMAGE = 128, 2, 8, 32

# attribute -> small value, applied wherever the default config (or a sub-config) has the attribute
SMALL = {
    "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "intermediate_size": 64, "vocab_size": VOCAB, "max_position_embeddings": 64, "head_dim": 8,
    "n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 64, "n_inner": 64, "n_ctx": 64,
    "d_model": 32, "d_ff": 64, "d_kv": 8, "num_layers": 2, "num_heads": 4, "num_decoder_layers": 2,
    "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 4, "decoder_attention_heads": 4,
    "encoder_ffn_dim": 64, "decoder_ffn_dim": 64, "embedding_size": 32, "projection_dim": 32,
    "image_size": IMAGE, "patch_size": 8, "ffn_dim": 64, "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32, "num_experts": 4, "num_local_experts": 4, "num_experts_per_tok": 2,
    "rotary_dim": 4, "partial_rotary_factor": 0.5, "max_source_positions": 32, "max_target_positions": 32,
    "num_mel_bins": 16, "num_conv_pos_embeddings": 16, "num_conv_pos_embedding_groups": 4,
    "intermediate_dim": 64, "global_attn_every_n_layers": 2, "state_size": 8, "expand": 2,
    "attention_hidden_size": 32, "num_labels": 3, "type_vocab_size": 2, "sliding_window": 4,
}

DROPOUTS = (
    "dropout", "attention_dropout", "activation_dropout", "hidden_dropout", "hidden_dropout_prob",
    "attention_probs_dropout_prob", "resid_pdrop", "embd_pdrop", "attn_pdrop", "embed_dropout", "classifier_dropout",
    "attention_dropout_prob", "hidden_dropout_rate", "layerdrop", "encoder_layerdrop", "decoder_layerdrop",
    "feat_proj_dropout", "final_dropout", "drop_path_rate", "classifier_dropout_prob", "summary_first_dropout",
    "attn_dropout", "resid_dropout", "ffn_dropout", "mlp_dropout", "emb_dropout", "embedding_dropout",
    "residual_dropout", "drop_rate", "dropout_rate", "classifier_dropout_rate", "mask_time_prob",
    "mask_feature_prob", "hidden_dropout_ratio", "attention_dropout_ratio",
)

SUB_CONFIGS = ("text_config", "vision_config", "audio_config")


@dataclass
class Arch:
    """One architecture: its model class, its kind (which inputs it takes) and config overrides."""
    model: str  # the transformers class name
    kind: str  # a key of INPUTS
    config: dict = field(default_factory=dict)  # overrides on top of SMALL (sub-configs as nested dicts)

    def build(self) -> torch.nn.Module:
        cls = getattr(transformers, self.model)
        config = tiny_config(cls.config_class, self.config)
        return cls(config)


def _small_kwargs(default, overrides: dict) -> dict:
    """The constructor kwargs that shrink `default` (a config instance)."""
    present = set(default.to_dict())
    kwargs = {k: v for k, v in SMALL.items() if k in present}
    kwargs.update({k: 0.0 for k in DROPOUTS if k in present and isinstance(getattr(default, k), float)})
    if "depths" in present and isinstance(default.depths, (list, tuple)):
        kwargs["depths"] = [1] * len(default.depths)
    if "conv_dim" in present:  # the feature encoder's channels, one per conv layer
        kwargs["conv_dim"] = (32,) * len(default.conv_dim)
    vocab = kwargs.get("vocab_size", getattr(default, "vocab_size", None))
    for key in present:
        value = getattr(default, key, None)
        if key.endswith("_token_id") and isinstance(value, int) and vocab and value >= VOCAB:
            kwargs[key] = 2 + (hash(key) % 3)  # inside the shrunk vocabulary; distinct ids barely matter here
    for key in SUB_CONFIGS:
        sub = getattr(default, key, None)
        if sub is not None and hasattr(sub, "to_dict"):
            kwargs[key] = _small_kwargs(sub, overrides.get(key, {}))
    kwargs.update({k: v for k, v in overrides.items() if k not in SUB_CONFIGS})
    if "problem_type" in present:
        kwargs.setdefault("problem_type", "single_label_classification")
    return kwargs


def tiny_config(config_class, overrides: dict):
    return config_class(**_small_kwargs(config_class(), overrides))


def _ids(g, n=SEQ, high=VOCAB):
    return torch.randint(3, high, (BATCH, n), generator=g)


def _causal(model, g, train):
    x = _ids(g)
    return {"input_ids": x, "labels": _ids(g)} if train else {"input_ids": x}


def _sequence_classification(model, g, train):
    mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    mask[1, SEQ - 3:] = 0
    out = {"input_ids": _ids(g), "attention_mask": mask}
    if train:
        out["labels"] = torch.randint(0, model.config.num_labels, (BATCH,), generator=g)
    return out


def _seq2seq(model, g, train):
    if train:
        return {"input_ids": _ids(g), "labels": _ids(g)}
    return {"input_ids": _ids(g), "decoder_input_ids": _ids(g)}


def _pixels(model):
    config = getattr(model.config, "vision_config", model.config)
    size = getattr(config, "image_size", 64)
    size = size[0] if isinstance(size, (list, tuple)) else size
    return BATCH, getattr(config, "num_channels", 3), size, size


def _image_classification(model, g, train):
    out = {"pixel_values": torch.randn(*_pixels(model), generator=g)}
    if train:
        out["labels"] = torch.randint(0, model.config.num_labels, (BATCH,), generator=g)
    return out


def _ctc(model, g, train):
    out = {"input_values": torch.randn(BATCH, 16000, generator=g)}
    if train:
        out["labels"] = torch.randint(1, model.config.vocab_size, (BATCH, 4), generator=g)
    return out


def _speech_seq2seq(model, g, train):
    c = model.config
    if hasattr(c, "max_source_positions") and hasattr(c, "num_mel_bins"):  # Whisper: (batch, mels, frames)
        features = torch.randn(BATCH, c.num_mel_bins, 2 * c.max_source_positions, generator=g)
        out = {"input_features": features}
    else:  # Speech2Text: (batch, frames, features per channel)
        out = {"input_features": torch.randn(BATCH, 32, c.input_feat_per_channel, generator=g)}
    out["labels" if train else "decoder_input_ids"] = _ids(g)
    return out


def _audio_classification(model, g, train):
    c = model.config
    out = {"input_values": torch.randn(BATCH, c.max_length, c.num_mel_bins, generator=g)}
    if train:
        out["labels"] = torch.randint(0, c.num_labels, (BATCH,), generator=g)
    return out


def _contrastive(model, g, train):
    out = {"input_ids": _ids(g), "pixel_values": torch.randn(*_pixels(model), generator=g)}
    if train:
        out["return_loss"] = True
    return out


def _visual_question_answering(model, g, train):
    out = {"input_ids": _ids(g), "pixel_values": torch.randn(BATCH, 3, IMAGE, IMAGE, generator=g)}
    if train:
        out["labels"] = torch.rand(BATCH, model.config.num_labels, generator=g)
    return out


INPUTS: dict[str, Callable] = {
    "decoder": _causal, "encoder": _sequence_classification, "encoder-decoder": _seq2seq,
    "vision": _image_classification, "audio": _ctc, "speech-seq2seq": _speech_seq2seq,
    "audio-classification": _audio_classification, "multimodal": _contrastive,
    "vqa": _visual_question_answering,
}

_STAGES4 = {"hidden_sizes": [8, 16, 24, 32], "depths": [1, 1, 1, 1]}

ARCHITECTURES: dict[str, Arch] = {
    # decoders
    "llama": Arch("LlamaForCausalLM", "decoder"),
    "mistral": Arch("MistralForCausalLM", "decoder"),
    "qwen2": Arch("Qwen2ForCausalLM", "decoder"),
    "qwen3": Arch("Qwen3ForCausalLM", "decoder"),
    "gemma": Arch("GemmaForCausalLM", "decoder"),
    "gemma2": Arch("Gemma2ForCausalLM", "decoder"),
    "gemma3_text": Arch("Gemma3ForCausalLM", "decoder"),
    "phi": Arch("PhiForCausalLM", "decoder"),
    "phi3": Arch("Phi3ForCausalLM", "decoder"),
    "gpt2": Arch("GPT2LMHeadModel", "decoder"),
    "gpt_neo": Arch("GPTNeoForCausalLM", "decoder", {"attention_types": [[["global", "local"], 1]],
                                                      "window_size": 4}),
    "gpt_neox": Arch("GPTNeoXForCausalLM", "decoder"),
    "gptj": Arch("GPTJForCausalLM", "decoder"),
    "opt": Arch("OPTForCausalLM", "decoder", {"word_embed_proj_dim": 32}),
    "bloom": Arch("BloomForCausalLM", "decoder"),
    "falcon": Arch("FalconForCausalLM", "decoder"),
    "mpt": Arch("MptForCausalLM", "decoder"),
    "codegen": Arch("CodeGenForCausalLM", "decoder"),
    "stablelm": Arch("StableLmForCausalLM", "decoder"),
    "starcoder2": Arch("Starcoder2ForCausalLM", "decoder"),
    "olmo": Arch("OlmoForCausalLM", "decoder"),
    "olmo2": Arch("Olmo2ForCausalLM", "decoder"),
    "cohere": Arch("CohereForCausalLM", "decoder"),
    "granite": Arch("GraniteForCausalLM", "decoder"),
    "persimmon": Arch("PersimmonForCausalLM", "decoder"),
    "biogpt": Arch("BioGptForCausalLM", "decoder"),
    "xglm": Arch("XGLMForCausalLM", "decoder"),
    "mixtral": Arch("MixtralForCausalLM", "decoder"),
    "qwen2_moe": Arch("Qwen2MoeForCausalLM", "decoder"),
    "ctrl": Arch("CTRLLMHeadModel", "decoder", {"dff": 64}),
    "gpt_bigcode": Arch("GPTBigCodeForCausalLM", "decoder"),
    "helium": Arch("HeliumForCausalLM", "decoder"),
    "glm": Arch("GlmForCausalLM", "decoder"),
    "smollm3": Arch("SmolLM3ForCausalLM", "decoder"),
    "nemotron": Arch("NemotronForCausalLM", "decoder"),
    "mamba": Arch("MambaForCausalLM", "decoder"),
    "rwkv": Arch("RwkvForCausalLM", "decoder", {"context_length": 64}),
    # encoders
    "bert": Arch("BertForSequenceClassification", "encoder"),
    "roberta": Arch("RobertaForSequenceClassification", "encoder"),
    "distilbert": Arch("DistilBertForSequenceClassification", "encoder", {"dim": 32, "n_layers": 2, "n_heads": 4,
                                                                            "hidden_dim": 64}),
    "albert": Arch("AlbertForSequenceClassification", "encoder"),
    "electra": Arch("ElectraForSequenceClassification", "encoder"),
    "deberta": Arch("DebertaForSequenceClassification", "encoder"),
    "deberta_v2": Arch("DebertaV2ForSequenceClassification", "encoder"),
    "xlm_roberta": Arch("XLMRobertaForSequenceClassification", "encoder"),
    "camembert": Arch("CamembertForSequenceClassification", "encoder"),
    "mpnet": Arch("MPNetForSequenceClassification", "encoder"),
    "ernie": Arch("ErnieForSequenceClassification", "encoder"),
    "convbert": Arch("ConvBertForSequenceClassification", "encoder"),
    "funnel": Arch("FunnelForSequenceClassification", "encoder", {"block_sizes": [1, 1], "d_head": 8,
                                                                    "d_inner": 64}),
    "squeezebert": Arch("SqueezeBertForSequenceClassification", "encoder"),
    "mobilebert": Arch("MobileBertForSequenceClassification", "encoder", {"intra_bottleneck_size": 16,
                                                                            "true_hidden_size": 16}),
    "megatron_bert": Arch("MegatronBertForSequenceClassification", "encoder"),
    "rembert": Arch("RemBertForSequenceClassification", "encoder", {"input_embedding_size": 16,
                                                                      "output_embedding_size": 16}),
    "roformer": Arch("RoFormerForSequenceClassification", "encoder"),
    "xlm": Arch("XLMForSequenceClassification", "encoder", {"emb_dim": 32, "n_layers": 2, "n_heads": 4}),
    "flaubert": Arch("FlaubertForSequenceClassification", "encoder", {"emb_dim": 32, "n_layers": 2, "n_heads": 4}),
    "data2vec_text": Arch("Data2VecTextForSequenceClassification", "encoder"),
    "esm": Arch("EsmForSequenceClassification", "encoder", {"pad_token_id": 1, "mask_token_id": 2}),
    "modernbert": Arch("ModernBertForSequenceClassification", "encoder", {"local_attention": 4}),
    # encoder-decoders
    "t5": Arch("T5ForConditionalGeneration", "encoder-decoder", {"decoder_start_token_id": 0}),
    "bart": Arch("BartForConditionalGeneration", "encoder-decoder"),
    "mbart": Arch("MBartForConditionalGeneration", "encoder-decoder"),
    "pegasus": Arch("PegasusForConditionalGeneration", "encoder-decoder"),
    "marian": Arch("MarianMTModel", "encoder-decoder", {"decoder_vocab_size": VOCAB}),
    "blenderbot": Arch("BlenderbotForConditionalGeneration", "encoder-decoder"),
    "blenderbot_small": Arch("BlenderbotSmallForConditionalGeneration", "encoder-decoder"),
    "mt5": Arch("MT5ForConditionalGeneration", "encoder-decoder"),
    "m2m_100": Arch("M2M100ForConditionalGeneration", "encoder-decoder"),
    "plbart": Arch("PLBartForConditionalGeneration", "encoder-decoder"),
    "umt5": Arch("UMT5ForConditionalGeneration", "encoder-decoder"),
    "longt5": Arch("LongT5ForConditionalGeneration", "encoder-decoder",
                   {"local_radius": 4, "decoder_start_token_id": 0}),
    "led": Arch("LEDForConditionalGeneration", "encoder-decoder", {"attention_window": [4, 4],
                                                                     "max_encoder_position_embeddings": 64,
                                                                     "max_decoder_position_embeddings": 64}),
    "prophetnet": Arch("ProphetNetForConditionalGeneration", "encoder-decoder", {"ngram": 2, "num_buckets": 8,
                                                                                  "relative_max_distance": 16}),
    # vision
    "vit": Arch("ViTForImageClassification", "vision"),
    "deit": Arch("DeiTForImageClassification", "vision"),
    "beit": Arch("BeitForImageClassification", "vision"),
    "swin": Arch("SwinForImageClassification", "vision", {"embed_dim": 16, "num_heads": [2, 2, 2, 2],
                                                            "window_size": 2, "patch_size": 2}),
    "swinv2": Arch("Swinv2ForImageClassification", "vision", {"embed_dim": 16, "num_heads": [2, 2, 2, 2],
                                                                "window_size": 2, "patch_size": 2}),
    "convnext": Arch("ConvNextForImageClassification", "vision", {**_STAGES4, "patch_size": 4, "image_size": 64}),
    "convnextv2": Arch("ConvNextV2ForImageClassification", "vision", {**_STAGES4, "patch_size": 4, "image_size": 64}),
    "resnet": Arch("ResNetForImageClassification", "vision", {**_STAGES4, "embedding_size": 8}),
    "regnet": Arch("RegNetForImageClassification", "vision", {**_STAGES4, "embedding_size": 8, "groups_width": 8}),
    "mobilenet_v1": Arch("MobileNetV1ForImageClassification", "vision", {"depth_multiplier": 0.25}),
    "mobilenet_v2": Arch("MobileNetV2ForImageClassification", "vision", {"depth_multiplier": 0.25}),
    "dinov2": Arch("Dinov2ForImageClassification", "vision"),
    "segformer": Arch("SegformerForImageClassification", "vision", {"hidden_sizes": [8, 16, 24, 32],
                                                                      "num_attention_heads": [1, 1, 2, 2],
                                                                      "decoder_hidden_size": 32}),
    "mobilevit": Arch("MobileViTForImageClassification", "vision", {"hidden_sizes": [16, 24, 32],
                                                                      "neck_hidden_sizes": [8, 8, 16, 16, 24, 24, 32],
                                                                      "image_size": 64}),
    "focalnet": Arch("FocalNetForImageClassification", "vision", {"embed_dim": 16, "patch_size": 2}),
    "pvt": Arch("PvtForImageClassification", "vision", {"hidden_sizes": [8, 16, 24, 32], "image_size": 64,
                                                          "num_attention_heads": [1, 1, 2, 2]}),
    "data2vec_vision": Arch("Data2VecVisionForImageClassification", "vision"),
    # audio
    "wav2vec2": Arch("Wav2Vec2ForCTC", "audio"),
    "hubert": Arch("HubertForCTC", "audio"),
    "wavlm": Arch("WavLMForCTC", "audio", {"num_buckets": 16, "max_bucket_distance": 32}),
    "data2vec_audio": Arch("Data2VecAudioForCTC", "audio"),
    "sew": Arch("SEWForCTC", "audio"),
    "unispeech": Arch("UniSpeechForCTC", "audio"),
    "whisper": Arch("WhisperForConditionalGeneration", "speech-seq2seq"),
    "speech_to_text": Arch("Speech2TextForConditionalGeneration", "speech-seq2seq",
                           {"input_feat_per_channel": 16, "conv_channels": 16}),
    "audio_spectrogram_transformer": Arch("ASTForAudioClassification", "audio-classification",
                                          {"max_length": 32, "num_mel_bins": 16}),
    # multimodal
    "clip": Arch("CLIPModel", "multimodal"),
    "siglip": Arch("SiglipModel", "multimodal"),
    "chinese_clip": Arch("ChineseCLIPModel", "multimodal"),
    "vilt": Arch("ViltForQuestionAnswering", "vqa", {"max_image_length": 16}),
}
