"""The extractor update (docs/design.md §3.2): one CISPO step per full buffer, AdamW, grad clip, weight sync.

CISPO's ratio compares the trainer's current log-probs with the generation-time (old) log-probs the
engine reported, token by token, over the response only (the prompt is context). The loss is
token-mean over the whole buffer (the paper's 1/Σ|m_i|), accumulated over micro-batches by the loop both
trainers share (``trainer.update``); generations whose advantage is 0 (weight 0, or a reward equal to the
buffer mean) add nothing to the loss and are not run, but their tokens still count in the denominator.

Stale weights are caught twice: the engine's version must be the one last synced (``Extractor``), and
the engine's log-probs of generations sampled by the current version must agree with the trainer's
(``extractor/engine_logp_diff``); far beyond dtype noise raises ``StaleExtractorError``.

Many ranks (``trainer.parallel``): every rank holds the whole buffer, so 1/Σ|m_i| counts the whole
buffer's tokens, and trains on its share of the generations; FSDP sums the ranks' gradients. Batches go
to the model's device.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from trainer import parallel
from trainer.config import ExtractorConfig
from trainer.extractor.credit import Batch
from trainer.extractor.model import Extractor, StaleExtractorError
from trainer.lora import served_state_dict
from trainer.metrics import Metrics
from trainer.rollout.base import sequence_logprobs
from trainer.store import Generation
from trainer.update import MicroBatch, MicroBatchLoss, PolicyUpdate, Trained, pad_rows


@dataclass
class _Sample:
    """One generation of the buffer: its prompt's token ids, the generation and its advantage."""

    prompt_ids: list[int]
    generation: Generation
    adv: float


class ExtractorUpdate(PolicyUpdate[_Sample, ExtractorConfig]):
    """Owns πϕ's trainer model and optimiser; ``step`` is one CISPO update, ``sync`` serves the result."""

    name = "extractor"

    def step(self, batch: Batch, extractor: Extractor) -> Metrics:
        """One optimiser step on ``batch`` (its advantages already carry the reweighting)."""
        t0 = time.perf_counter()
        samples = [
            _Sample(extractor.prompt_ids(r.generation.prompt), r.generation, adv)
            for r, adv in zip(batch.records, batch.advantages.tolist(), strict=True)
        ]
        n_tok = sum(len(s.generation.token_ids) for s in samples)  # the whole buffer's: CISPO's 1/Σ|m_i|
        live = self._live(samples)
        trained = self._forward_backward(self._micro_batches(live), lambda mb: self._loss(mb, n_tok))
        engine_diff = self._engine_diff(trained, extractor)
        metrics = self._finish(trained, stepped=bool(live))
        return metrics | {
            "extractor/reward_mean": float(batch.rewards.mean()),
            "extractor/adv_abs_mean": float(batch.advantages.abs().mean()),
            "extractor/weight_mean": float(batch.weights.mean()),
            "extractor/zero_weight_frac": float((batch.weights == 0).float().mean()),
            "extractor/samples": float(len(samples)),
            "extractor/trained_samples": float(len(live)),
            "extractor/tokens": float(n_tok),
            "extractor/engine_logp_diff": engine_diff,
            "extractor/off_policy_frac": sum(
                s.generation.weight_version != extractor.expected_version for s in samples
            )
            / max(len(samples), 1),
            "time/extractor_update_s": time.perf_counter() - t0,
        }

    def _loss(self, mb: MicroBatch[_Sample], num_tokens: int) -> MicroBatchLoss:
        """The policy loss of a micro-batch over the response tokens (the prompt is context), token-mean
        over the ``num_tokens`` of the whole buffer."""
        responses = [list(s.generation.token_ids) for s in mb.items]
        with parallel.autocast(self.model):
            logp_rows = sequence_logprobs(
                self.model, [s.prompt_ids for s in mb.items], responses, batch_size=len(responses)
            )
        logp = torch.nn.utils.rnn.pad_sequence(logp_rows, batch_first=True)  # (B, T), keeps grad
        B, T = logp.shape
        old_logp = pad_rows([s.generation.logprobs for s in mb.items], self.device, T)
        mask = pad_rows([[1.0] * len(r) for r in responses], self.device, T)
        loss, metrics = self.policy_loss(
            logp,
            old_logp,
            torch.tensor([s.adv for s in mb.items], device=self.device),
            mask,
            eps_low=self.cfg.eps_low,
            eps_high=self.cfg.eps_high,
            agg="token-mean",
            num_tokens=num_tokens,
        )
        return MicroBatchLoss(loss, mask, logp.detach(), metrics)

    def _engine_diff(self, trained: list[Trained[_Sample]], extractor: Extractor) -> float:
        """Mean |engine - trainer| log-prob over the whole buffer's generations sampled by the weights the
        trainer holds now (only those compare like for like); far beyond dtype noise raises
        ``StaleExtractorError``. Every rank judges the same sum, so all raise or none does."""
        diffs = [torch.zeros(0)]
        for t in trained:
            for s, logp in zip(t.items, t.logp, strict=True):
                if s.generation.weight_version == extractor.expected_version:
                    row = logp[: len(s.generation.token_ids)].cpu()
                    diffs.append((torch.tensor(s.generation.logprobs) - row).abs())
        diff = torch.cat(diffs)
        diff_sum, n_diff = parallel.all_sum([float(diff.sum()), diff.numel()], self.model)
        mean_diff = diff_sum / n_diff if n_diff else 0.0
        if mean_diff > self.max_engine_diff:
            raise StaleExtractorError(
                f"extractor engine log-probs differ from the trainer's by {mean_diff:.3f} per token on "
                f"average (limit {self.max_engine_diff}): the engine is not serving the extractor's weights"
            )
        return mean_diff

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
