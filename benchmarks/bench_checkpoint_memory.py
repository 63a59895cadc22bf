"""A helper rank's host memory at a checkpoint (issue 47): what one ``Checkpointer.save`` of a sharded run
adds to rank 1's peak resident memory, against the size of its shard.

    OMP_NUM_THREADS=1 .venv/bin/python -m torch.distributed.run --standalone --nproc-per-node 2 \\
        benchmarks/bench_checkpoint_memory.py [--layers 8 --hidden 768]

A random-initialised Llama (SmolLM2-like shape, 32k vocabulary, tied embeddings, float32) is sharded over 2
CPU ranks (FSDP2, gloo), takes one AdamW step, and is checkpointed once. Each rank resets its peak RSS
(``/proc/self/clear_refs``) just before the save and reads ``VmHWM`` after it; rank 0 prints every rank's
figures. Rank 0 writes the whole-model Hugging Face folder, so its peak holds one full copy; a helper rank
only sends its shards (``parallel.main_state_dict``).

Measured on the 2-core CPU box (74.9 M parameters, 286 MiB whole, 143 MiB a rank's shard): rank 1's peak
rose by 386 MiB during a save when every rank gathered the whole model (``full_state_dict``), by 189 MiB
with ``get_model_state_dict(full_state_dict=True, cpu_offload=True)`` (an all-gather per tensor, dropped
on the helpers), and by 0 MiB with the gather to rank 0 that the checkpointer uses.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from trainer import parallel
from trainer.checkpoint import Checkpointer
from trainer.config import get_preset

MIB = 1 << 20


def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=768)
    args = parser.parse_args()
    placement = parallel.init_distributed("cpu")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=32000, hidden_size=args.hidden, intermediate_size=args.hidden * 8 // 3,
                         num_hidden_layers=args.layers, num_attention_heads=args.hidden // 64,
                         num_key_value_heads=args.hidden // 192, tie_word_embeddings=True)  # fmt: skip
    model = parallel.parallelize(LlamaForCausalLM(config).float(), placement)
    n_params = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    model(input_ids=torch.randint(0, 32000, (1, 16)), labels=torch.randint(0, 32000, (1, 16))).loss.backward()
    optimizer.step()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(WordLevel({"[UNK]": 0}, unk_token="[UNK]")), unk_token="[UNK]"
    )
    out = Path(parallel.broadcast_object(tempfile.mkdtemp(prefix="ckpt-mem-")))
    cfg = get_preset("cpu").with_overrides(nproc=placement.world_size)
    actor = SimpleNamespace(model=model, optimizer=optimizer)
    checkpointer = Checkpointer(out, cfg, actor, tokenizer, sharded=placement.distributed)
    parallel.barrier()
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    before = _status("VmRSS")
    checkpointer.save(1, engine_version=1, elapsed_s=0.0)
    figures = {"rank": placement.rank, "rss_before": before, "peak": _status("VmHWM")}
    rows = parallel.gather_values(figures)
    if placement.rank == 0:
        full = n_params * 4
        shard = full / placement.world_size / MIB
        print(f"model: {n_params / 1e6:.1f} M parameters, {full / MIB:.0f} MiB float32 whole, "
              f"{shard:.0f} MiB a rank's shard (x3 with AdamW's moments)")  # fmt: skip
        for row in rows:
            added = row["peak"] - row["rss_before"]
            before, peak = row["rss_before"] / MIB, row["peak"] / MIB
            print(f"rank {row['rank']}: RSS before the save {before:.0f} MiB, peak during it {peak:.0f} MiB: "
                  f"+{added / MIB:.0f} MiB")  # fmt: skip
    parallel.barrier()
    if placement.rank == 0:
        shutil.rmtree(out, ignore_errors=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
