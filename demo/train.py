"""Train the bundled demo model: `python -m demo.train [--out models/demo]`.

A BPE tokenizer and a small `glm5_sparse` model (router + MTP heads) trained on the Xinghe
handbook corpus rendered with the GLM chat template: the Q&A and dialogues as plain chat (how the
bot answers without a knowledge base) and, mostly, as the worker asks with a knowledge base —
the retrieved passages in the system message, the answer marked with the passage that holds it,
"not found" when none does (`demo.grounded`). Loss on the assistant's reply only, plus
the DeepSeek-V3 MTP loss (depth d predicts the token d + 2 ahead) so that MTP drafts are accepted.
Deterministic (fixed seed, deterministic algorithms, 2 threads); about 40 minutes on the 2-core CPU.

Training runs the model's own modules in a batched, cache-free forward (`batched_forward`):
every training sequence is shorter than the sliding window (1,024 tokens here, room for four
passages), so the sparse contract is exactly dense causal attention scaled by the router's local
weight (no key node is visible yet).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from tqdm import tqdm

from app.knowledge import prompt
from demo.corpus import HANDBOOKS, load_dialogues, load_unanswerable, training_pairs
from demo.grounded import CONTACTS, DEMO_QUOTE_UNIT, grounded_samples
from demo.reading import lesson, sample_texts
from inference.config import ModelConfig
from inference.layers.activation import silu_and_mul
from inference.loader import checkpoint_state_dict
from inference.models.glm5_sparse import DecoderLayer, Glm5SparseForCausalLM
from inference.tokenizer import ChatTokenizer, build_glm_tokenizer, save_glm_tokenizer

SEED = 1234
VOCAB_SIZE = 4096
# The product's default system prompt (app/config.py): each epoch about half the samples carry it.
SYSTEM_PROMPT = "你是企业微信里的公司助手，回答简洁、准确、礼貌。"
END_OF_TURN = "<|user|>"  # GLM ends a reply by opening the next user turn (an eos id)
MTP_WEIGHT = 0.5  # per depth; high, because drafts that match the model are the point
# Made-up documents an epoch, each read once (demo.reading), with --reading: 0 for the shipped
# model (two runs with 1,500 and 3,500 did not learn to read: models/demo/README.md)
READING_LESSONS = 0


def demo_config(vocab_size: int, eos_ids: list[int]) -> dict:
    return {
        "architectures": ["Glm5SparseForCausalLM"],
        "model_type": "glm5_sparse",
        "vocab_size": vocab_size,
        "hidden_size": 256,
        "intermediate_size": 640,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_theta": 10000.0, "partial_rotary_factor": 0.5},
        "max_position_embeddings": 4096,
        "attention_bias": False,
        "tie_word_embeddings": False,
        "sliding_window": 1024,
        "global_interval": 64,
        "routed": True,
        "route_threshold": 0.0,
        "num_mtp_heads": 3,
        "eos_token_id": eos_ids,
        "dtype": "float32",  # compute dtype: bf16 decode is 30 % slower on this CPU; the file is bf16
    }


# ---------------------------------------------------------------- data


def tokenizer_texts(reading: bool = False) -> list[str]:
    """Everything the model may see in training (held-out questions excluded)."""
    texts = [path.read_text(encoding="utf-8") for path, _ in HANDBOOKS] + [SYSTEM_PROMPT]
    texts += [prompt.system_message(SYSTEM_PROMPT, [], contact) for contact in CONTACTS]
    for q, a in training_pairs():
        texts += [q, a]
    for dialogue in load_dialogues():
        texts += [m["content"] for m in dialogue["messages"]]
    texts += [row["question"] for row in load_unanswerable()]
    if reading:  # made-up companies' words (demo.reading)
        texts += sample_texts(random.Random(SEED), 400)
    return texts


def reading_lessons(tok: ChatTokenizer, count: int, rng: random.Random, first: int,
                    most_others: int = 2) -> list:
    """``count`` fresh reading lessons (``demo.reading``), rendered as grounded conversations,
    each over at most ``most_others`` passages besides the one that answers."""
    rendered = []
    for serial in range(first, first + count):
        question, passages, reply = lesson(rng, serial, most_others=most_others)
        system = prompt.system_message(SYSTEM_PROMPT, passages, rng.choice(CONTACTS))
        messages = [{"role": "system", "content": system}, {"role": "user", "content": question},
                    {"role": "assistant", "content": reply}]
        rendered.append(render(tok, messages, False, last_only=True))
    return rendered


def conversations() -> list[list[dict]]:
    """Plain chat, without passages: the bot when the knowledge base is empty or off."""
    convs = [
        [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
        for q, a in training_pairs()
    ]
    convs += [d["messages"] for d in load_dialogues()]
    return convs


def render(tok: ChatTokenizer, messages: list[dict], system: bool,
           last_only: bool = False) -> tuple[list[int], list[int]]:
    """Token ids and a 0/1 mask of the tokens the model must produce (assistant replies and the
    end-of-turn token after each; the last reply only with `last_only`)."""
    if system:
        messages = [{"role": "system", "content": SYSTEM_PROMPT}, *messages]
    end = tok.tokenizer.token_to_id(END_OF_TURN)
    ids = tok.apply_chat_template([], add_generation_prompt=False)
    mask = [0] * len(ids)
    last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
    for index, message in enumerate(messages):
        if message["role"] == "assistant":
            ids.append(tok.role_id("assistant"))
            mask.append(0)
            reply = tok.encode(f"\n{message['content']}") + [end]
            ids += reply
            mask += [int(index == last or not last_only)] * len(reply)
        else:
            part = tok.apply_chat_template([message], add_generation_prompt=False)[2:]
            ids += part
            mask += [0] * len(part)
    return ids, mask


def batches(samples: list[tuple[list[int], list[int]]], tokens_per_batch: int, rng: random.Random):
    """Length-bucketed batches (little padding), in a shuffled order."""
    order = sorted(range(len(samples)), key=lambda i: (len(samples[i][0]), rng.random()))
    groups, group, longest = [], [], 0
    for i in order:
        longest = max(longest, len(samples[i][0]))
        if group and longest * (len(group) + 1) > tokens_per_batch:
            groups.append(group)
            group, longest = [], len(samples[i][0])
        group.append(i)
    groups.append(group)
    rng.shuffle(groups)
    for group in groups:
        width = max(len(samples[i][0]) for i in group)
        ids = torch.zeros(len(group), width, dtype=torch.long)
        mask = torch.zeros(len(group), width)
        for row, i in enumerate(group):
            n = len(samples[i][0])
            ids[row, :n] = torch.tensor(samples[i][0])
            mask[row, :n] = torch.tensor(samples[i][1], dtype=torch.float)
        yield ids, mask


# ---------------------------------------------------------------- batched forward


def _rotate(x: torch.Tensor, rotations: torch.Tensor) -> torch.Tensor:
    """Out-of-place GLM rotary for `x [B, L, heads, D]` (the engine's is in place)."""
    r = rotations.shape[-1] * 2
    pairs = torch.view_as_complex(x[..., :r].float().unflatten(-1, (-1, 2)).contiguous())
    rotated = torch.view_as_real(pairs * rotations[None, :, None]).flatten(-2).to(x.dtype)
    return torch.cat((rotated, x[..., r:]), dim=-1)


def layer_forward(layer: DecoderLayer, h: torch.Tensor, rotations: torch.Tensor) -> torch.Tensor:
    """One decoder layer on `h [B, L, hidden]`, dense causal (all positions inside the window)."""
    attn = layer.self_attn
    b, n, _ = h.shape
    heads, kv, d = attn.num_heads, attn.num_kv_heads, attn.head_dim
    x = layer.input_layernorm(h)
    qkv = attn.qkv_proj(x).view(b, n, heads + 2 * kv, d)
    q = _rotate(qkv[:, :, :heads], rotations).transpose(1, 2)
    k = _rotate(qkv[:, :, heads : heads + kv], rotations).transpose(1, 2)
    v = qkv[:, :, heads + kv :].transpose(1, 2)
    k, v = k.repeat_interleave(heads // kv, 1), v.repeat_interleave(heads // kv, 1)
    out = (
        F.scaled_dot_product_attention(q, k, v, is_causal=True)
        .transpose(1, 2)
        .reshape(b, n, heads * d)
    )
    if layer.router is not None:
        p_local = torch.softmax(layer.router(x).float(), dim=-1)[..., :1]
        out = out * p_local.to(out.dtype)
    h = h + attn.o_proj(out)
    return h + layer.mlp.down_proj(
        silu_and_mul(layer.mlp.gate_up_proj(layer.post_attention_layernorm(h)))
    )


def batched_forward(
    model: Glm5SparseForCausalLM, ids: torch.Tensor, depths: int
) -> list[torch.Tensor]:
    """Normed hidden states of the main model `[B, L]` and of MTP depths 0..depths-1: depth d
    covers positions `[0, L - d - 1)` (its input at i is the previous depth's state at i and the
    token at i + d + 1) and predicts the token at i + d + 2."""
    n = ids.shape[1]
    rotations = model.rotary.rotations(torch.arange(n))
    h = model.model.embed_tokens(ids)
    for layer in model.model.layers:
        h = layer_forward(layer, h, rotations)
    hidden = model.model.norm(h)
    outs = [hidden]
    for d in range(depths):
        mtp = model.model.mtp[d]
        width = n - d - 1
        prev = outs[-1][:, :width]
        embeds = model.model.embed_tokens(ids[:, d + 1 : d + 1 + width])
        h = mtp.eh_proj(torch.cat((mtp.enorm(embeds), mtp.hnorm(prev)), dim=-1))
        outs.append(model.model.norm(layer_forward(mtp.block, h, rotations[:width])))
    return outs


def losses(
    model: Glm5SparseForCausalLM, ids: torch.Tensor, mask: torch.Tensor
) -> list[torch.Tensor]:
    """Cross-entropy of the main head and each MTP depth, on the masked (assistant) targets.

    Logits only where there is a target: with passages in the prompt most positions have none,
    and the vocabulary projection would otherwise be half the work."""
    outs = batched_forward(model, ids, model.config.num_mtp_heads)
    result = []
    for d, hidden in enumerate(outs):
        shift = d + 1  # the main head predicts 1 ahead, depth d predicts d + 2 ahead
        width = ids.shape[1] - shift
        chosen = mask[:, shift:].flatten() > 0
        if not chosen.any():
            result.append(hidden.sum() * 0.0)
            continue
        logits = model.compute_logits(hidden[:, :width].flatten(0, 1)[chosen]).float()
        result.append(F.cross_entropy(logits, ids[:, shift:].flatten()[chosen]))
    return result


# ---------------------------------------------------------------- training


def init_weights(model: Glm5SparseForCausalLM) -> None:
    for name, p in model.named_parameters():
        if p.dim() == 1:
            continue  # norms stay 1
        std = 0.02
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            std = 0.02 / math.sqrt(2 * model.config.num_hidden_layers)
        torch.nn.init.normal_(p, std=std)


def train(out_dir: Path, epochs: int, tokens_per_batch: int, lr: float, reading: int,
          max_steps: int = 0, quote_unit: str = "passage", reading_only: bool = False) -> None:
    started = time.time()
    random.seed(SEED)
    torch.manual_seed(SEED)
    torch.set_num_threads(2)
    torch.use_deterministic_algorithms(True, warn_only=True)

    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in ("generation_config.json",):  # written fresh below
        (out_dir / stale).unlink(missing_ok=True)
    tokenizer = build_glm_tokenizer(tokenizer_texts(reading > 0), VOCAB_SIZE)
    save_glm_tokenizer(tokenizer, out_dir)
    tok = ChatTokenizer.from_pretrained(out_dir)
    raw = demo_config(tok.vocab_size, tok.eos_token_ids)
    config = ModelConfig.from_dict(raw, dtype="float32")

    # (without, with) the system prompt for each plain conversation; a grounded one has its own
    rendered = [(render(tok, c, False), render(tok, c, True)) for c in conversations()]
    plain = len(rendered)
    grounded = [render(tok, s.messages, False, last_only=True)
                for s in grounded_samples(SYSTEM_PROMPT, SEED, quote_unit)]
    fitting = [r for r in grounded if len(r[0]) < config.sliding_window]
    rendered += [(r, r) for r in fitting]
    longest = max(len(pair[1][0]) for pair in rendered)
    assert longest < config.sliding_window, "training assumes every sample fits the window"
    print(f"{plain} plain and {len(fitting)} grounded conversations "
          f"({len(grounded) - len(fitting)} longer than the window left out), longest {longest} tokens, "
          f"{sum(len(p[1][0]) for p in rendered)} tokens an epoch")
    if reading_only:  # whether the lessons alone teach it to read (no handbook to recite)
        rendered = []

    model = Glm5SparseForCausalLM(config)
    init_weights(model)
    model.train()
    params = sum(p.numel() for p in model.parameters())
    print(f"model: {params / 1e6:.2f}M parameters, {config.num_mtp_heads} MTP heads")
    decay = [p for p in model.parameters() if p.dim() > 1]
    no_decay = [p for p in model.parameters() if p.dim() <= 1]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr,
        betas=(0.9, 0.95),
    )
    rng = random.Random(SEED)

    lessons = random.Random(SEED + 1)

    def epoch_samples(epoch: int) -> list[tuple[list[int], list[int]]]:
        """The handbook's conversations (half with the system prompt) and fresh reading lessons,
        the first epoch's over the answering passage alone (finding the sentence is learnt before
        finding the passage), one more passage beside it each epoch after."""
        return [pair[rng.random() < 0.5] for pair in rendered] + reading_lessons(
            tok, reading, lessons, first=epoch * reading, most_others=min(2, epoch))

    # The cosine schedule is laid out over an upper bound of the steps (every sample with the
    # system prompt); the epochs really take about 18 % fewer, so the lr ends near 0.2 x peak.
    # Reading lessons are counted as they come (each epoch's are fresh).
    steps_per_epoch = sum(
        1 for _ in batches([p[1] for p in rendered], tokens_per_batch, random.Random(0))
    ) if rendered else 0
    # every epoch's batches up front (the same draws of `rng`, in the same order), for the bar
    plan = [list(batches(epoch_samples(epoch), tokens_per_batch, rng)) for epoch in range(epochs)]
    total = epochs * steps_per_epoch if not reading else sum(len(epoch) for epoch in plan)
    print(f"{reading} reading lessons an epoch, {sum(len(epoch) for epoch in plan)} steps")
    warmup = max(1, total // 30)

    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.05 + 0.95 * 0.5 * (
            1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup))
        )

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    bar = tqdm(total=sum(len(epoch) for epoch in plan), desc="train", unit="step")
    for epoch, epoch_batches in enumerate(plan):
        for ids, mask in epoch_batches:
            parts = losses(model, ids, mask)  # fp32: bf16 autocast was 3x slower on this CPU
            loss = parts[0] + MTP_WEIGHT * sum(parts[1:])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            bar.update(1)
            if max_steps and bar.n >= max_steps:
                break
            bar.set_postfix(
                epoch=epoch,
                main=f"{parts[0].item():.3f}",
                mtp=" ".join(f"{p.item():.2f}" for p in parts[1:]),
            )
    bar.close()

    state = {
        k: v.detach().to(torch.bfloat16).contiguous()
        for k, v in checkpoint_state_dict(model).items()
    }
    save_file(state, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
    print(f"wrote {out_dir} in {time.time() - started:.0f} s")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m demo.train")
    parser.add_argument("--out", type=Path, default=Path("models/demo"))
    parser.add_argument("--epochs", type=int, default=7)
    parser.add_argument("--tokens-per-batch", type=int, default=3072)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--reading", type=int, default=READING_LESSONS,
                        help="fresh reading lessons an epoch (demo.reading; with --quote-unit sentence)")
    parser.add_argument("--quote-unit", choices=("passage", "sentence"), default=DEMO_QUOTE_UNIT,
                        help="what a grounded answer quotes (KB_QUOTE_UNIT the model is made for)")
    parser.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (a trial)")
    parser.add_argument("--reading-only", action="store_true",
                        help="the reading lessons alone, no handbook (does it learn to read at all?)")
    args = parser.parse_args(argv)
    train(args.out, args.epochs, args.tokens_per_batch, args.lr, args.reading, args.max_steps,
          args.quote_unit, args.reading_only)


if __name__ == "__main__":
    main()
