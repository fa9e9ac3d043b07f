"""
A small modern GPT trained on bytes for a fixed time budget, then scored in bits per byte.
This is the one file the researcher edits; the data, budget and metric live in prepare.py.

    python train.py                            # HARNESS_TIME_BUDGET seconds (default 300)
    HARNESS_MAX_STEPS=20 python train.py       # step-bounded: bit-identical from run to run
"""

import math
import time

T_SCRIPT_START = time.time()  # total_seconds counts imports too

import torch
import torch.nn as nn
import torch.nn.functional as F

from prepare import (MAX_STEPS, SEED, TIME_BUDGET, TRAIN_DATA_DIR, VOCAB_SIZE, evaluate_bpb, get_batch, load_split,
                     report, save_model)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# -----------------------------------------------------------------------------
# Hyperparameters. Sizes differ by device: a ~1M-parameter model for a laptop CPU,
# ~25M parameters for a 5-minute H100/H200 run (about Chinchilla-sized for the bytes it sees).

DEPTH = 4 if DEVICE == "cpu" else 8  # transformer blocks
WIDTH = 128 if DEVICE == "cpu" else 512  # residual stream channels
HEAD_DIM = 32 if DEVICE == "cpu" else 64  # channels per attention head
SEQ_LEN = 64 if DEVICE == "cpu" else 2048  # bytes of context
BATCH_SIZE = 32  # sequences per optimizer step (64K bytes on CUDA, 2K on CPU)
MLP_RATIO = 4  # hidden channels of the MLP, in multiples of WIDTH
ROPE_BASE = 10000.0  # rotary frequency base
LEARNING_RATE = 3e-3  # peak AdamW learning rate
WEIGHT_DECAY = 0.1  # decoupled AdamW weight decay
ADAM_BETA1 = 0.9  # first-moment decay
ADAM_BETA2 = 0.95  # second-moment decay
GRAD_CLIP = 1.0  # max global gradient norm
WARMUP_FRAC = 0.05  # fraction of the run spent ramping the learning rate up
WARMDOWN_FRAC = 0.4  # fraction of the run spent decaying it linearly
FINAL_LR_FRAC = 0.0  # learning rate at the end, as a fraction of the peak
INIT_STD = 0.02  # std of the normal init of embeddings and input projections
LOG_EVERY = 25  # steps between loss printouts (each one waits for the GPU)
FAIL_LOSS = 20.0  # nats; a loss above this (random guessing is 5.5) means the run diverged

# -----------------------------------------------------------------------------
# Model


def norm(x):
    # RMSNorm without a learned gain: one less parameter tensor per layer, same quality at this size
    return F.rms_norm(x, (x.size(-1),))


def rotary_tables(seq_len, head_dim, base):
    inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv_freq)
    return angles.cos()[None, None], angles.sin()[None, None]  # (1, 1, T, head_dim / 2)


def apply_rotary(x, cos, sin):
    # rotate each pair of channels by a position-dependent angle, so q.k depends on relative position
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).type_as(x)


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.n_head = WIDTH // HEAD_DIM
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH, bias=False)
        self.proj = nn.Linear(WIDTH, WIDTH, bias=False)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_head, HEAD_DIM).permute(2, 0, 3, 1, 4)
        # QK-norm keeps attention logits bounded, which lets the learning rate be high
        q, k = apply_rotary(norm(q), cos, sin), apply_rotary(norm(k), cos, sin)
        # under autocast the norms may return fp32; the attention kernel wants one dtype
        y = F.scaled_dot_product_attention(q.type_as(v), k.type_as(v), v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(WIDTH, MLP_RATIO * WIDTH, bias=False)
        self.down = nn.Linear(MLP_RATIO * WIDTH, WIDTH, bias=False)

    def forward(self, x):
        return self.down(F.relu(self.up(x)).square())  # ReLU^2: cheap and a little better than GELU


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = Attention()
        self.mlp = MLP()

    def forward(self, x, cos, sin):
        x = x + self.attn(norm(x), cos, sin)
        return x + self.mlp(norm(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB_SIZE, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(DEPTH))
        self.head = nn.Linear(WIDTH, VOCAB_SIZE, bias=False)
        cos, sin = rotary_tables(SEQ_LEN, HEAD_DIM, ROPE_BASE)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        for name, p in self.named_parameters():
            # output projections start at zero: every block begins as the identity, and the
            # initial prediction is uniform (loss = ln 256)
            if name.endswith(("proj.weight", "down.weight")) or name == "head.weight":
                nn.init.zeros_(p)
            else:
                nn.init.normal_(p, std=INIT_STD)

    def forward(self, idx):
        T = idx.size(1)
        cos, sin = self.cos[:, :, :T], self.sin[:, :, :T]
        x = norm(self.embed(idx))
        for block in self.blocks:
            x = block(x, cos, sin)
        return self.head(norm(x))


def flops_per_token(model):
    # 6 FLOPs per parameter per token (forward + backward) for the matmuls, plus attention scores
    matmul_params = sum(p.numel() for name, p in model.named_parameters() if name != "embed.weight")
    return 6 * matmul_params + 12 * DEPTH * WIDTH * SEQ_LEN


PEAK_BF16_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12}  # dense, per GPU


def peak_flops():
    name = torch.cuda.get_device_name() if DEVICE == "cuda" else ""
    return next((v for k, v in PEAK_BF16_FLOPS.items() if k in name), 0.0)


# -----------------------------------------------------------------------------
# Setup

torch.manual_seed(SEED)
if DEVICE == "cuda":
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
autocast = torch.autocast(DEVICE, dtype=torch.bfloat16, enabled=DEVICE == "cuda")
batch_generator = torch.Generator(device=DEVICE).manual_seed(SEED)

raw_model = GPT().to(DEVICE)
model = torch.compile(raw_model) if DEVICE == "cuda" else raw_model
optimizer = torch.optim.AdamW(raw_model.parameters(), lr=LEARNING_RATE, betas=(ADAM_BETA1, ADAM_BETA2),
                              weight_decay=WEIGHT_DECAY, fused=DEVICE == "cuda")
num_params = sum(p.numel() for p in raw_model.parameters())
print(f"device {DEVICE} | {num_params / 1e6:.2f}M parameters | budget {TIME_BUDGET:.0f}s"
      + (f" or {MAX_STEPS} steps" if MAX_STEPS else ""))


def train_step(x, y):
    with autocast:
        logits = model(x)
    loss = F.cross_entropy(logits.float().view(-1, VOCAB_SIZE), y.reshape(-1))
    loss.backward()
    return loss.detach()


if DEVICE == "cuda":
    # compile the forward and backward once on a dummy batch, so compilation is not charged to
    # the time budget; no optimizer step, so the weights are untouched
    dummy = torch.zeros(BATCH_SIZE, SEQ_LEN, dtype=torch.long, device=DEVICE)
    train_step(dummy, dummy)
    optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()


def lr_multiplier(progress):
    # linear warmup, constant, then linear warmdown to FINAL_LR_FRAC; progress runs 0 -> 1
    if progress < WARMUP_FRAC:
        return (progress + 1e-8) / WARMUP_FRAC
    if progress > 1 - WARMDOWN_FRAC:
        return FINAL_LR_FRAC + (1 - FINAL_LR_FRAC) * (1 - progress) / WARMDOWN_FRAC
    return 1.0


def check(loss_value, step):
    if not math.isfinite(loss_value) or loss_value > FAIL_LOSS:
        print(f"FAIL: loss {loss_value} at step {step}", flush=True)
        raise SystemExit(1)


# -----------------------------------------------------------------------------
# Training loop. Only the steps are timed; with HARNESS_MAX_STEPS the schedule follows the step
# count instead of the clock, so step-bounded runs repeat bit for bit.

load_split("train", DEVICE)  # load (and verify) the corpus before the clock starts
step = 0
t_start = time.time()
training_seconds = 0.0
while True:
    training_seconds = time.time() - t_start  # no GPU sync: the launch queue keeps this close to GPU time
    progress = step / MAX_STEPS if MAX_STEPS else training_seconds / TIME_BUDGET
    step_seconds = training_seconds / step if step else 0.0  # the mean step so far
    if progress >= 1 or training_seconds + step_seconds > TIME_BUDGET:
        break  # the next step would end past the budget: the harness times the job itself
    for group in optimizer.param_groups:
        group["lr"] = LEARNING_RATE * lr_multiplier(progress)
    x, y = get_batch("train", BATCH_SIZE, SEQ_LEN, DEVICE, batch_generator)
    loss = train_step(x, y)
    torch.nn.utils.clip_grad_norm_(raw_model.parameters(), GRAD_CLIP)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    step += 1
    if step % LOG_EVERY == 0:
        loss_value = loss.item()  # the only host sync in the loop
        check(loss_value, step)
        print(f"step {step:05d} | loss {loss_value:.4f} | lr {optimizer.param_groups[0]['lr']:.2e} | {training_seconds:.1f}s", flush=True)

if DEVICE == "cuda":
    torch.cuda.synchronize()
training_seconds = time.time() - t_start
check(loss.item(), step)

# -----------------------------------------------------------------------------
# Evaluation and report. Under the harness the validation bytes are out of this job's reach: the
# model is saved (save_model) and the harness scores it in a separate process. Run alone, the
# model is scored here too; both score the same bytes the same way (prepare.score).

save_model(raw_model, SEQ_LEN, BATCH_SIZE)  # the uncompiled model; a no-op unless HARNESS_OUTPUT_DIR is set
val_bpb = None if TRAIN_DATA_DIR else evaluate_bpb(raw_model, SEQ_LEN, BATCH_SIZE)
if val_bpb is not None:
    check(val_bpb, step)
tokens = step * BATCH_SIZE * SEQ_LEN
peak = peak_flops()
report(
    val_bpb=val_bpb,
    training_seconds=training_seconds,
    total_seconds=time.time() - T_SCRIPT_START,
    peak_vram_mb=torch.cuda.max_memory_allocated() / 2**20 if DEVICE == "cuda" else 0.0,
    mfu_percent=100 * flops_per_token(raw_model) * tokens / training_seconds / peak if peak else 0.0,
    total_tokens_M=tokens / 1e6,
    num_steps=step,
    num_params_M=num_params / 1e6,
)
