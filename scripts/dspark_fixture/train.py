"""Train the DSpark drafter on the target's own greedy text; calibrate its confidence head;
measure its acceptance the way greedy speculative decoding would see it.

* Data: corpus windows of ``PREFIX`` tokens continued greedily by the target to ``LENGTH``
  (the text greedy serving verifies; generated with vLLM), with the target's residual
  streams at ``TARGET_LAYER_IDS`` and its final hidden states from one transformers forward.
* Loss: cross-entropy of every block slot against the next greedy token (slot j weighted
  ``SLOT_DECAY ** j``), blocks of a width drawn per step from 1..``MAX_WIDTH`` at anchors
  inside the generated part; the confidence head (on detached features) against DSpark's
  soft label ``1 - 0.5 * |p_draft - p_target|_1`` of the greedy draft and the target at
  ``LABEL_TEMPERATURE`` (:func:`soft_label`).
* Calibration: one temperature per slot (sequential temperature scaling): slot j's on the
  held-out blocks whose slots before j were all accepted, fitted to whether slot j was
  accepted at temperature 0.  ECE of the cumulative survival per slot, before and after.
* Acceptance: mean accepted length (1 + accepted / drafting steps) of greedy speculative
  decoding on held-out greedy text at each width, walked from the start of the generated
  part as the engine would.
"""

from __future__ import annotations

import math
import os
import pathlib
import subprocess
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

from fixtures import train as TR
from fixtures.train import log_stderr
from vllm_hust_vspec.progress import Progress

from . import model as M

PREFIX = 32
LENGTH = 256
POOL = 384
HELD_OUT = 48
BATCH = 16
ANCHORS = 16
SLOT_DECAY = 0.8
#: The target temperature of the confidence head's label (0: greedy verification, what the
#: budget's start-up calibration and the fixtures' acceptance measurements serve).  At 1 the
#: head learnt the acceptance of temperature-1 sampling, ~0.4 where greedy accepts ~0.9, and
#: no temperature can lift a negative logit above 0.5: ECE 0.47-0.70 per slot, 0.40-0.65 after.
LABEL_TEMPERATURE = 0.0
ECE_BINS = 10


def _aux_and_post(target, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(concatenated residual streams after ``TARGET_LAYER_IDS``, final normed hidden)."""
    outs: dict[int, torch.Tensor] = {}
    hooks = [layer.register_forward_hook(lambda m, a, o, i=i: outs.__setitem__(i, o[0] if isinstance(o, tuple) else o))
             for i, layer in enumerate(target.model.layers)]
    try:
        with torch.no_grad():
            post = target.model(input_ids=x).last_hidden_state
    finally:
        for h in hooks:
            h.remove()
    return torch.cat([outs[i] for i in M.TARGET_LAYER_IDS], dim=-1), post


class Pool:
    """Greedy continuations of corpus windows (``PREFIX`` tokens continued to ``LENGTH`` by
    the target, generated with vLLM: ``greedy.py``) and the target's features on them."""

    def __init__(self, target, target_dir: pathlib.Path, stream: np.ndarray, n: int, seed: int,
                 desc: str, work: pathlib.Path) -> None:
        rng = np.random.default_rng(seed)
        starts = rng.integers(0, len(stream) - PREFIX, size=n)
        tag = f"{seed}-{os.getpid()}"
        src, out = work / f".dspark-prefixes-{tag}.npy", work / f".dspark-greedy-{tag}.npy"
        np.save(src, np.stack([stream[s : s + PREFIX] for s in starts]).astype(np.int64))
        log_stderr(f"dspark: {desc}: {n} greedy continuations of {LENGTH - PREFIX} tokens (vLLM)")
        subprocess.run([sys.executable, str(pathlib.Path(__file__).with_name("greedy.py")), str(target_dir),
                        str(src), str(out), str(LENGTH - PREFIX)], check=True, stdout=sys.stderr)
        x = torch.from_numpy(np.load(out))
        src.unlink()
        out.unlink()
        aux, post = [], []
        with Progress(-(-n // BATCH), f"dspark: {desc} features") as bar:
            for chunk in x.split(BATCH):
                a, p = _aux_and_post(target, chunk)
                aux.append(a)
                post.append(p)
                bar.update()
        self.x, self.aux, self.post = x, torch.cat(aux), torch.cat(post)
        self.rng = np.random.default_rng(seed + 1)

    def __len__(self) -> int:
        return self.x.shape[0]


def _blocks(draft: M.DSparkDraft, x: torch.Tensor, aux: torch.Tensor, anchors: torch.Tensor,
            width: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Hidden states [B, A, W, H] of blocks at ``anchors`` [B, A] with teacher-forced
    ``prev`` tokens [B, A, W] and the labels [B, A, W]."""
    b, t = x.shape
    a = anchors.shape[1]
    offs = torch.arange(width)
    pos = anchors.unsqueeze(-1) + offs  # [B, A, W]
    block_ids = torch.full((b, a, width), draft.mask_token_id, dtype=torch.long)
    block_ids[:, :, 0] = x.gather(1, anchors)
    ctx = draft.context(aux)
    ctx_pos = torch.arange(t).unsqueeze(0).expand(b, t)
    mask = M.block_mask(anchors, t, width)
    hid = draft.backbone(block_ids.view(b, a * width), pos.view(b, a * width), ctx, ctx_pos, mask)
    prev = x.gather(1, pos.view(b, -1)).view(b, a, width)  # the token at a+j precedes slot j's
    labels = x.gather(1, (pos + 1).view(b, -1)).view(b, a, width)
    return hid.view(b, a, width, -1), prev, labels


def _anchors(rng: np.random.Generator, b: int, width: int) -> torch.Tensor:
    lo, hi = PREFIX - 1, LENGTH - 1 - width
    return torch.from_numpy(np.sort(np.stack([rng.choice(np.arange(lo, hi + 1), ANCHORS, replace=False)
                                              for _ in range(b)]), axis=1)).long()


def soft_label(draft_logits: torch.Tensor, target_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """DSpark's soft label ``1 - 0.5 * |p_draft - p_target|_1`` per slot, with the
    distributions serving uses: the draft greedy (``p_draft`` the point mass on its argmax
    ``x``, so the label is ``p_target(x)``) and the target at ``temperature`` (0: its argmax,
    and the label is whether ``x`` is that argmax)."""
    x = draft_logits.argmax(-1, keepdim=True)
    if temperature == 0:
        return (x == target_logits.argmax(-1, keepdim=True)).squeeze(-1).float()
    return (target_logits.float() / temperature).softmax(-1).gather(-1, x).squeeze(-1)


def train(draft: M.DSparkDraft, target, pool: Pool, steps: int, lr: float) -> float:
    """``steps`` AdamW steps; returns steps per second."""
    draft.train()
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.01)
    weights_cache: dict[int, torch.Tensor] = {}
    t0 = time.perf_counter()
    with Progress(steps, "dspark: train") as bar:
        for step in range(steps):
            width = int(pool.rng.integers(1, M.MAX_WIDTH + 1))
            idx = torch.from_numpy(pool.rng.choice(len(pool), BATCH, replace=False))
            x, aux = pool.x[idx], pool.aux[idx]
            anchors = _anchors(pool.rng, BATCH, width)
            hid, prev, labels = _blocks(draft, x, aux, anchors, width)
            logits = draft.slot_logits(hid, prev)
            w = weights_cache.setdefault(width, SLOT_DECAY ** torch.arange(width, dtype=torch.float32))
            ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none")
            lm_loss = (ce.view(-1, width) * w).sum() / (w.sum() * ce.numel() / width)
            with torch.no_grad():
                pos = (anchors.unsqueeze(-1) + torch.arange(width)).view(BATCH, -1)
                t_logits = target.lm_head(pool.post[idx].gather(
                    1, pos.unsqueeze(-1).expand(-1, -1, pool.post.shape[-1]))).view_as(logits)
                soft = soft_label(logits, t_logits, LABEL_TEMPERATURE)
            conf = draft.confidence_logit(hid.detach(), prev)
            conf_loss = F.binary_cross_entropy_with_logits(conf, soft)
            loss = lm_loss + conf_loss
            loss.backward()
            for g in opt.param_groups:
                g["lr"] = TR.lr_at(step, steps, lr)
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            bar.update(lm=lm_loss.item(), conf=conf_loss.item())
    draft.eval()
    return steps / (time.perf_counter() - t0)


@torch.no_grad()
def held_out_blocks(draft: M.DSparkDraft, pool: Pool, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy drafts at every anchor of the generated part: (accepted [n, W] as 0/1 with the
    slots after a rejection counted as rejected too, confidence logits [n, W])."""
    acc, conf = [], []
    lo, hi = PREFIX - 1, LENGTH - 1 - width
    for i in range(len(pool)):
        x, aux = pool.x[i : i + 1], pool.aux[i : i + 1]
        anchors = torch.arange(lo, hi + 1).unsqueeze(0)
        hid, prev, labels = _blocks(draft, x, aux, anchors, width)
        toks, z = draft.draft(hid[0], x[0, anchors[0]])
        ok = (toks == labels[0]).long().cumprod(-1)
        acc.append(ok)
        conf.append(z)
    return torch.cat(acc), torch.cat(conf)


def fit_temperatures(acc: torch.Tensor, conf: torch.Tensor) -> list[float]:
    """Per-slot temperature minimising the log loss of ``sigmoid(z / T)`` against slot j's
    acceptance, over the blocks whose earlier slots were all accepted."""
    temps = []
    for j in range(acc.shape[1]):
        live = acc[:, j - 1].bool() if j else torch.ones(acc.shape[0], dtype=torch.bool)
        z, y = conf[live, j].double(), acc[live, j].double()
        if z.numel() < 20 or y.min() == y.max():
            temps.append(1.0)
            continue
        grid = torch.exp(torch.linspace(math.log(0.05), math.log(20.0), 400, dtype=torch.float64))
        losses = torch.stack([F.binary_cross_entropy_with_logits(z / t, y) for t in grid])
        temps.append(float(grid[int(losses.argmin())]))
    return temps


def cumulative_ece(acc: torch.Tensor, conf: torch.Tensor, temps: list[float]) -> list[float]:
    """ECE (``ECE_BINS`` equal-width bins) of the predicted survival through slot k
    (product of the slot confidences) against whether slots 0..k were all accepted."""
    t = torch.tensor(temps, dtype=torch.float64)
    surv = torch.sigmoid(conf.double() / t).cumprod(-1)
    out = []
    for k in range(acc.shape[1]):
        p, y = surv[:, k], acc[:, k].double()
        bins = torch.clamp((p * ECE_BINS).long(), max=ECE_BINS - 1)
        ece = 0.0
        for b_ in range(ECE_BINS):
            sel = bins == b_
            if sel.any():
                ece += sel.double().mean().item() * abs(p[sel].mean().item() - y[sel].mean().item())
        out.append(round(ece, 4))
    return out


@torch.no_grad()
def walk_mal(draft: M.DSparkDraft, pool: Pool, width: int, temps: list[float]) -> dict[str, float]:
    """Greedy speculative decoding over each held-out continuation from its first generated
    token: anchor at a, accept the matching prefix m of the block, next anchor a + m + 1;
    the confidences calibrated with the per-slot temperatures ``temps``."""
    t = torch.tensor(temps[:width])
    steps = accepted = 0
    conf_acc: list[float] = []
    conf_rej: list[float] = []
    for i in range(len(pool)):
        x, aux = pool.x[i : i + 1], pool.aux[i : i + 1]
        lo, hi = PREFIX - 1, LENGTH - 1 - width
        hid, prev, labels = _blocks(draft, x, aux, torch.arange(lo, hi + 1).unsqueeze(0), width)
        a = lo
        while a <= hi:
            toks, z = draft.draft(hid[0, a - lo : a - lo + 1], x[0, a : a + 1])
            ok = (toks[0] == labels[0, a - lo]).long().cumprod(-1)
            m = int(ok.sum())
            c = torch.sigmoid(z[0] / t).tolist()
            conf_acc += c[:m]
            conf_rej += c[m : m + 1]
            steps += 1
            accepted += m
            a += m + 1
    return {"mal": round(1 + accepted / max(steps, 1), 4), "drafts": steps, "accepted": accepted,
            "confidence_accepted": round(float(np.mean(conf_acc)) if conf_acc else float("nan"), 4),
            "confidence_rejected": round(float(np.mean(conf_rej)) if conf_rej else float("nan"), 4)}
