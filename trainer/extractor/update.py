"""The extractor update (DESIGN §3.2): one CISPO step per full buffer, AdamW, grad clip, weight sync.

CISPO's ratio compares the trainer's current log-probs with the generation-time (old) log-probs the
engine reported, token by token, over the response only (the prompt is context). The loss is
token-mean over the whole buffer (the paper's 1/Σ|m_i|), accumulated over micro-batches; generations whose
advantage is 0 (weight 0, or a reward equal to the buffer mean) add nothing to the loss and are not run,
but their tokens still count in the denominator.

Stale weights are caught twice: the engine's version must be the one last synced (``Extractor``), and
the engine's log-probs of generations sampled by the current version must agree with the trainer's
(``extractor/engine_logp_diff``); far beyond dtype noise raises ``StaleExtractorError``.

Many ranks (``trainer.parallel``): every rank holds the whole buffer, so 1/Σ|m_i| counts the whole
buffer's tokens, and trains on its share of the generations; FSDP sums the ranks' gradients. Batches go
to the model's device.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from trainer import losses, memory, parallel
from trainer.cancel import CancelToken
from trainer.config import ExtractorConfig
from trainer.extractor.credit import Batch, Record
from trainer.extractor.model import Extractor, StaleExtractorError
from trainer.lora import served_state_dict
from trainer.rollout.base import sequence_logprobs

Metrics = dict[str, float]


def _pad(
    rows: Sequence[Sequence[float]] | Sequence[torch.Tensor], B: int, T: int, device: torch.device
) -> torch.Tensor:
    out = torch.zeros(B, T, dtype=torch.float32, device=device)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.as_tensor(r, dtype=torch.float32, device=device)
    return out


class ExtractorUpdate:
    """Owns πϕ's trainer model and optimiser; ``step`` is one CISPO update, ``sync`` serves the result."""

    def __init__(self, model: torch.nn.Module, cfg: ExtractorConfig, *, max_engine_diff: float = 1.0) -> None:
        self.model = model
        self.device = parallel.model_device(model)
        self.cfg = cfg
        self.max_engine_diff = max_engine_diff
        self.policy_loss = losses.get_policy_loss(cfg.policy_loss)
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
        self.cancel = CancelToken()
        """Checked between micro-batches; the loop hands it its own token."""
        # a sharded model got its checkpointing from ``parallel.parallelize``
        if (
            cfg.gradient_checkpointing
            and hasattr(model, "gradient_checkpointing_enable")
            and not parallel.is_sharded(model)
        ):
            model.gradient_checkpointing_enable()

    def step(self, batch: Batch, extractor: Extractor) -> Metrics:
        """One optimiser step on ``batch`` (its advantages already carry the reweighting)."""
        t0 = time.perf_counter()
        records = batch.records
        prompts = [extractor.prompt_ids(r.generation.prompt) for r in records]
        n_tok = sum(len(r.generation.token_ids) for r in records)
        live = [i for i, a in enumerate(batch.advantages.tolist()) if a != 0.0]
        mbs = parallel.rank_micro_batches(live, self.cfg.micro_batch_size, *parallel.trainers_of(self.model))
        # a rank with nothing left still joins the sharded forward and backward: one generation, advantage 0
        fillers = [not mb for mb in mbs]
        mbs = [mb or live[:1] for mb in mbs]
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        total, diffs = 0.0, [torch.zeros(0)]
        sums = {"clip_frac": 0.0, "approx_kl": 0.0}
        for mb, filler in zip(mbs, fillers, strict=True):
            self.cancel.check()
            with memory.ONE_PASS:  # never beside the actor's activations (trainer.memory)
                responses = [list(records[i].generation.token_ids) for i in mb]
                with parallel.autocast(self.model):
                    logp_rows = sequence_logprobs(
                        self.model, [prompts[i] for i in mb], responses, batch_size=len(mb)
                    )
                logp = torch.nn.utils.rnn.pad_sequence(logp_rows, batch_first=True)  # (B, T), keeps grad
                B, T = logp.shape
                old_logp = _pad([records[i].generation.logprobs for i in mb], B, T, self.device)
                mask = _pad([[1.0] * len(r) for r in responses], B, T, self.device)
                adv = batch.advantages[mb].to(self.device) * (0.0 if filler else 1.0)
                loss, m = self.policy_loss(
                    logp,
                    old_logp,
                    adv,
                    mask,
                    eps_low=self.cfg.eps_low,
                    eps_high=self.cfg.eps_high,
                    agg="token-mean",
                    num_tokens=n_tok,
                )
                loss.backward()
            if filler:
                continue
            total += loss.item()
            k = int(mask.sum())
            for name in sums:
                sums[name] += m[name] * k
            diffs += self._engine_diffs([records[i] for i in mb], logp_rows, extractor)
        diff = torch.cat(diffs)
        # every rank reports (and judges staleness on) the whole buffer
        total, diff_sum, n_diff, *summed = parallel.all_sum(
            [total, float(diff.sum()), diff.numel(), *sums.values()], self.model
        )
        sums = dict(zip(sums, summed, strict=True))
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        trained_tok = sum(len(records[i].generation.token_ids) for i in live)
        mean_diff = diff_sum / n_diff if n_diff else 0.0
        if mean_diff > self.max_engine_diff:
            raise StaleExtractorError(
                f"extractor engine log-probs differ from the trainer's by {mean_diff:.3f} per token on "
                f"average (limit {self.max_engine_diff}): the engine is not serving the extractor's weights"
            )
        return {
            "extractor/loss": total,
            "extractor/grad_norm": float(parallel.full_tensor(grad_norm)),
            "extractor/clip_frac": sums["clip_frac"] / max(trained_tok, 1),
            "extractor/approx_kl": sums["approx_kl"] / max(trained_tok, 1),
            "extractor/reward_mean": float(batch.rewards.mean()),
            "extractor/adv_abs_mean": float(batch.advantages.abs().mean()),
            "extractor/weight_mean": float(batch.weights.mean()),
            "extractor/zero_weight_frac": float((batch.weights == 0).float().mean()),
            "extractor/samples": float(len(records)),
            "extractor/trained_samples": float(len(live)),
            "extractor/tokens": float(n_tok),
            "extractor/engine_logp_diff": mean_diff,
            "extractor/off_policy_frac": sum(
                r.generation.weight_version != extractor.expected_version for r in records
            )
            / max(len(records), 1),
            "time/extractor_update_s": time.perf_counter() - t0,
        }

    @staticmethod
    def _engine_diffs(
        records: Sequence[Record], logp_rows: Sequence[torch.Tensor], extractor: Extractor
    ) -> list:
        # only generations of the weights the trainer holds now can be compared like for like
        return [
            (torch.tensor(r.generation.logprobs) - row.detach().cpu()).abs()
            for r, row in zip(records, logp_rows, strict=True)
            if r.generation.weight_version == extractor.expected_version
        ]

    def sync(self, extractor: Extractor) -> float:
        """Serve the trained weights from the extractor's engine, one version up; returns the seconds.
        Sharded: every rank calls it (gathering the weights is a collective) and serves its own engine."""
        t0 = time.perf_counter()
        weights = served_state_dict(self.model)  # LoRA: merged
        with extractor.serving:  # no generation sees the new weights under the old version
            version = extractor.expected_version + 1
            extractor.engine.update_weights(weights, version)
            if extractor.engine.weight_version != version:
                raise StaleExtractorError(
                    f"the extractor engine reports weight version {extractor.engine.weight_version} after a "
                    f"sync to version {version}"
                )
            extractor.expected_version = version
        return time.perf_counter() - t0

    def train(self, batch: Batch, extractor: Extractor) -> Metrics:
        """``step`` on ``batch``, then ``sync``: one update of πϕ, served."""
        metrics = self.step(batch, extractor)
        metrics["time/extractor_sync_s"] = self.sync(extractor)
        return metrics
