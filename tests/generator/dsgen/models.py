"""Model descriptions: every trainable parameter with its full (unsharded) shape, how tensor
parallelism splits it, which pipeline layer holds it, and the universal_checkpoint_info patterns a
Megatron-DeepSpeed model of that family would publish."""
from dataclasses import dataclass, field
from typing import Optional, Tuple


@dataclass
class ModelConfig:
    family: str = "gpt"          # gpt | llama | mixtral | dsmoe
    layers: int = 4
    hidden: int = 32
    heads: int = 4
    kv_heads: int = 4            # < heads: GQA (llama, mixtral)
    ffn: int = 64
    vocab: int = 100             # original vocabulary size
    seq: int = 16                # position embeddings (gpt)
    tied: bool = True            # gpt only
    swiglu: bool = False         # gpt only (llama/mixtral always)
    experts: int = 4             # mixtral / dsmoe experts per MoE layer
    expert_interval: int = 2     # dsmoe: layers 1, 3, 5... are MoE
    experts_per_layer: tuple = ()  # dsmoe: experts of each MoE layer (empty: `experts` for all)
    # gpt / dsmoe: biases of the linear layers (QKV, dense, MLP and expert MLPs). False is Megatron-DeepSpeed's
    # --disable-bias-linear (arguments.py:937-939, add_bias_linear): ColumnParallelLinear / RowParallelLinear
    # get bias=add_bias_linear (megatron/model/transformer.py:110, :120-130, :154-163 ParallelMLP, the
    # experts' MLP too; :585 / :637 attention); LayerNorm keeps its bias (:988-998).
    bias_linear: bool = True
    # Pipeline layer numbering of GPTModelPipe's specs (layer_NN files), see PIPE_NUMBERING.
    pipe_numbering: str = "megatron-deepspeed"


@dataclass
class Param:
    name: str                    # global name (optimizer / param_shapes / universal folder)
    shape: Tuple[int, ...]       # full shape (vocab parameters: padded rows)
    kind: str                    # col | row | replicate | average | swiglu | subparams
    group: int                   # optimizer param group: 0 weight decay, 1 no weight decay
    stage: int = 0               # pipeline stage; tied embeddings live on first and last
    layer: Optional[int] = None  # pipeline layer index (layer files)
    local: str = ""              # layer-local name (layer files)
    subs: Tuple[int, ...] = ()   # subparams: sizes along dim 0
    vocab: bool = False
    tied_copy: bool = False      # the last stage's copy of the tied embedding
    moe_layer: Optional[int] = None  # dsmoe expert params: MoE layer id
    expert: Optional[int] = None     # dsmoe expert params: global expert id
    expert_local_name: str = ""      # dsmoe: name with the local expert index (set per EP size)


def pad_vocab(vocab, tp, multiple=8):
    m = multiple * tp
    return (vocab + m - 1) // m * m


@dataclass
class Model:
    cfg: ModelConfig
    params: list
    uc_info: dict
    padded_vocab: int
    pipe: bool
    num_experts: list = field(default_factory=list)   # dsmoe: E per MoE layer


# GPTModelPipe spec indices (= layer_NN numbers) in the two forks that exist in the wild:
# * deepspeedai/Megatron-DeepSpeed megatron/model/gpt_model.py (commit 4efb479): _to_float16 0
#   (:349), embedding 1 (TiedLayerSpec :362 / LayerSpec :353 untied), transformer blocks 2..L+1
#   (:386-388), final norm L+2 (:403), tied head L+3 (TiedLayerSpec :424 / LMHeadPipe :420);
# * bigscience-workshop/Megatron-DeepSpeed megatron/model/gpt_model.py (commit 8387ae1): _to_float16
#   0 (:222), embedding 1 (:225), transpose lambda 2 (:236-245), blocks 3..L+2 (:247-249), undo
#   transpose L+3 (:262), final norm L+4 (:265), tied head L+5 (:277).
# Values: (first block, layers between the last block and the final norm).
PIPE_NUMBERING = {"megatron-deepspeed": (2, 0), "bigscience": (3, 1)}


def _stage_of_layers(n_layers, pp):
    """Transformer layer i -> stage (contiguous, as even as possible)."""
    base, extra = divmod(n_layers, pp)
    out, s = [], 0
    for st in range(pp):
        out += [st] * (base + (1 if st < extra else 0))
    return out


def build(cfg: ModelConfig, tp: int, pp: int, ep: int = 1) -> Model:
    if cfg.family in ("llama", "mixtral"):
        cfg.swiglu = True
        cfg.tied = False
    pipe = pp > 1
    if pipe and cfg.family == "dsmoe":
        raise ValueError("native DeepSpeed MoE checkpoints have PP = 1")
    padded = pad_vocab(cfg.vocab, tp)
    H, F = cfg.hidden, cfg.ffn
    hd = H // cfg.heads
    q, kv = cfg.heads * hd, cfg.kv_heads * hd
    gqa = cfg.family in ("llama", "mixtral")
    biases = cfg.family in ("gpt", "dsmoe") and not cfg.swiglu  # LayerNorm biases
    lin_b = biases and cfg.bias_linear                            # biases of the linear layers
    norm_kind = "average" if gqa else "replicate"
    stages = _stage_of_layers(cfg.layers, pp)
    params = []
    # Pipeline layer indices as GPTModelPipe lays them out (PIPE_NUMBERING): embedding 1, blocks,
    # final norm, then the tied/untied head.
    if cfg.pipe_numbering not in PIPE_NUMBERING:
        raise ValueError(f"pipe_numbering must be one of {sorted(PIPE_NUMBERING)}")
    first_block, gap = PIPE_NUMBERING[cfg.pipe_numbering]
    final_norm_layer = first_block + cfg.layers + gap
    head_layer = final_norm_layer + 1

    def add(name, shape, kind, group, stage=0, layer=None, local="", **kw):
        params.append(Param(name, tuple(shape), kind, group, stage, layer, local, **kw))

    # Embeddings
    if pipe:
        add("tied_modules.embed.word_embeddings.weight", (padded, H), "col", 0, 0, 1,
            "word_embeddings.weight", vocab=True)
        if cfg.family == "gpt":
            add("tied_modules.embed.position_embeddings.weight", (cfg.seq, H), "replicate", 0, 0, 1,
                "position_embeddings.weight")
    else:
        add("language_model.embedding.word_embeddings.weight", (padded, H), "col", 0, vocab=True)
        if cfg.family in ("gpt", "dsmoe"):
            add("language_model.embedding.position_embeddings.weight", (cfg.seq, H), "replicate", 0)

    moe_id = 0
    num_experts = []
    for i in range(cfg.layers):
        st = stages[i]
        L = first_block + i
        pre = f"{L}." if pipe else f"language_model.encoder.layers.{i}."

        def lp(local, shape, kind, group, **kw):
            add(pre + local, shape, kind, group, st, L if pipe else None, local, **kw)

        lp("input_layernorm.weight", (H,), norm_kind, 1)
        if biases:
            lp("input_layernorm.bias", (H,), norm_kind, 1)
        if gqa:
            lp("self_attention.query_key_value.weight", (q + 2 * kv, H), "subparams", 0, subs=(q, kv, kv))
        else:
            lp("self_attention.query_key_value.weight", (3 * H, H), "col", 0)
            if lin_b:
                lp("self_attention.query_key_value.bias", (3 * H,), "col", 1)
        lp("self_attention.dense.weight", (H, q), "row", 0)
        if lin_b:
            lp("self_attention.dense.bias", (H,), "replicate", 1)
        lp("post_attention_layernorm.weight", (H,), norm_kind, 1)
        if biases:
            lp("post_attention_layernorm.bias", (H,), norm_kind, 1)
        is_moe = (cfg.family == "mixtral") or (cfg.family == "dsmoe" and i % cfg.expert_interval == cfg.expert_interval - 1)
        if cfg.family == "mixtral":
            lp("mlp.router.weight", (cfg.experts, H), "replicate", 0)
            for e in range(cfg.experts):
                lp(f"mlp.experts.{e}.dense_h_to_4h.weight", (2 * F, H), "swiglu", 0)
                lp(f"mlp.experts.{e}.dense_4h_to_h.weight", (H, F), "row", 0)
        elif is_moe:  # dsmoe
            n_exp = cfg.experts_per_layer[moe_id] if cfg.experts_per_layer else cfg.experts
            lp("mlp.deepspeed_moe.gate.wg.weight", (n_exp, H), "replicate", 0)
            for e in range(n_exp):
                x = f"mlp.deepspeed_moe.experts.deepspeed_experts.{e}."
                for local, shape, kind, group in ((x + "dense_h_to_4h.weight", (F, H), "col", 0),
                                                  (x + "dense_h_to_4h.bias", (F,), "col", 1),
                                                  (x + "dense_4h_to_h.weight", (H, F), "row", 0),
                                                  (x + "dense_4h_to_h.bias", (H,), "replicate", 1)):
                    if lin_b or not local.endswith(".bias"):
                        lp(local, shape, kind, group, moe_layer=moe_id, expert=e)
            moe_id += 1
            num_experts.append(n_exp)
        else:
            lp("mlp.dense_h_to_4h.weight", (2 * F if cfg.swiglu else F, H), "swiglu" if cfg.swiglu else "col", 0)
            if lin_b:
                lp("mlp.dense_h_to_4h.bias", (F,), "col", 1)
            lp("mlp.dense_4h_to_h.weight", (H, F), "row", 0)
            if lin_b:
                lp("mlp.dense_4h_to_h.bias", (H,), "replicate", 1)

    last = pp - 1
    if pipe:
        add(f"{final_norm_layer}.weight", (H,), norm_kind, 1, last, final_norm_layer, "weight")
        if biases:
            add(f"{final_norm_layer}.bias", (H,), norm_kind, 1, last, final_norm_layer, "bias")
        if cfg.tied:
            # The head's TiedLayerSpec('embed', EmbeddingPipe, ...) builds the whole EmbeddingPipe on the
            # last stage (deepspeed/runtime/pipe/module.py:260-261), so both embeddings are there; only
            # the word embedding is tied (tied_weight_attr), the position embedding copy is unused.
            add("tied_modules.embed.word_embeddings.weight", (padded, H), "col", 0, last, head_layer,
                "word_embeddings.weight", vocab=True, tied_copy=True)
            if cfg.family == "gpt":
                add("tied_modules.embed.position_embeddings.weight", (cfg.seq, H), "replicate", 0, last, head_layer,
                    "position_embeddings.weight", tied_copy=True)
        else:
            add(f"{head_layer}.lm_head.weight", (padded, H), "col", 0, last, head_layer, "lm_head.weight",
                vocab=True)
    else:
        add("language_model.encoder.final_layernorm.weight", (H,), norm_kind, 1)
        if biases:
            add("language_model.encoder.final_layernorm.bias", (H,), norm_kind, 1)
        if not cfg.tied:
            add("language_model.output_layer.weight", (padded, H), "col", 0, vocab=True)

    # Pipeline-local names of dsmoe experts (local expert index under EP).
    for p in params:
        if p.expert is not None:
            per = num_experts[p.moe_layer] // ep
            p.expert_local_name = p.name.replace(f"deepspeed_experts.{p.expert}.", f"deepspeed_experts.{p.expert % per}.")

    model = Model(cfg, params, {}, padded, pipe, num_experts)
    model.uc_info = uc_info_for(model)
    return model


def _esc(s):
    # Patterns as Megatron-DeepSpeed writes them: dots left unescaped.
    return s


def uc_info_for(model: Model) -> dict:
    """Category -> regex list; every pattern matches at least one parameter and no name matches two
    patterns of one category (what the strict converter demands)."""
    cfg, pipe = model.cfg, model.pipe
    L = r"\d+." if pipe else r"language_model.encoder.layers.\d+."
    info = {
        "universal_checkpoint_version": 0.2,
        "original_vocab_size": cfg.vocab,
        "padded_vocab_size": model.padded_vocab,
    }
    kinds = {p.kind for p in model.params}
    names = [p.name for p in model.params]
    vocab = [p.name.replace("." + str(p.layer) + ".", ".") if False else p.name for p in model.params if p.vocab]
    voc = []
    for n in dict.fromkeys(vocab):
        voc.append(r"\d+.lm_head.weight" if n.endswith("lm_head.weight") else n)
    info["vocabulary_parameter_patterns"] = voc
    if pipe and cfg.tied:
        # gpt_model.py:125-131 (deepspeedai): the vocabulary patterns plus the position embedding.
        info["pipeline_replicated_parameter_patterns"] = ["tied_modules.embed.word_embeddings.weight"]
        if cfg.family == "gpt":
            info["pipeline_replicated_parameter_patterns"].append("tied_modules.embed.position_embeddings.weight")
    else:
        info["pipeline_replicated_parameter_patterns"] = []
    rep, avg, row, two, subs = [], [], [], [], []
    norms = ["input_layernorm", "post_attention_layernorm"]
    biases = any(n.endswith("input_layernorm.bias") for n in names)
    lin_b = any(n.endswith("self_attention.dense.bias") for n in names)
    norm_list = avg if cfg.family in ("llama", "mixtral") else rep
    for nm in norms:
        norm_list.append(L + nm + (r".(weight|bias)" if biases else ".weight"))
    if pipe:
        norm_list.append(r"\d+.weight")
        if biases:
            norm_list.append(r"\d+.bias")
        if cfg.family == "gpt":
            rep.append("tied_modules.embed.position_embeddings.weight")
    else:
        norm_list.append("language_model.encoder.final_layernorm." + (r"(weight|bias)" if biases else "weight"))
        if cfg.family in ("gpt", "dsmoe"):
            rep.append("language_model.embedding.position_embeddings.weight")
    row.append(L + "self_attention.dense.weight")
    if lin_b:
        rep.append(L + "self_attention.dense.bias")
    if cfg.family == "mixtral":
        rep.append(L + "mlp.router.weight")
        two.append(L + r"mlp.experts.\d+.dense_h_to_4h.weight")
        row.append(L + r"mlp.experts.\d+.dense_4h_to_h.weight")
    else:
        if cfg.swiglu:
            two.append(L + "mlp.dense_h_to_4h.weight")
        row.append(L + "mlp.dense_4h_to_h.weight")
        if lin_b:
            rep.append(L + "mlp.dense_4h_to_h.bias")
    if cfg.family == "dsmoe":
        rep.append(L + "mlp.deepspeed_moe.gate.wg.weight")
        row.append(L + r"mlp.deepspeed_moe.experts.deepspeed_experts.\d+.dense_4h_to_h.weight")
        if lin_b:
            rep.append(L + r"mlp.deepspeed_moe.experts.deepspeed_experts.\d+.dense_4h_to_h.bias")
    if "subparams" in kinds:
        p = next(p for p in model.params if p.kind == "subparams")
        subs.append({"patterns": [L + "self_attention.query_key_value.weight"], "shape": [list(p.subs), -1],
                     "partition_dim": 0})
    info["tp_replicated_parameter_patterns"] = rep
    info["parameter_to_average_patterns"] = avg
    info["parameter_with_row_parallelism_patterns"] = row
    info["parameter_with_2_sub_params_cat_dim_0"] = two
    info["parameter_with_sub_params"] = subs
    return info
