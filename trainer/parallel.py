"""Devices and data parallelism, applied in one place to a plain model (docs/design.md §7).

``init_distributed(device)`` is called once at start: it reads torchrun's environment (RANK, WORLD_SIZE,
LOCAL_RANK), picks the device, the process-group backend (gloo on the CPU, nccl on CUDA) and the compute
dtype (bfloat16 on CUDA over float32 weights and optimiser state, float32 on the CPU), and returns them
as a ``Placement``. One process without torchrun starts no process group and runs unchanged.

``parallelize(model, placement)`` then applies the techniques in a fixed order, torchtitan's
``parallelize_llama`` style: ``apply_ac`` (activation checkpointing per block), ``apply_fsdp``
(``fully_shard`` each transformer block, then the root). The updates never ask how many ranks there are:
every rank holds the whole batch, whose loss weights are therefore global, and trains on its share
(``rank_micro_batches``). The per-rank losses add up to the full-batch loss, so the gradient reduction
sums rather than averages (``apply_fsdp``), and the N-rank gradient equals the 1-rank one.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, Shard

T = TypeVar("T")
R = TypeVar("R")
_joined: list[bool] = []
"""Set once ``init_distributed`` has started this process's group: the one group ``destroy`` may end."""


@dataclass(frozen=True)
class Placement:
    """What this process trains on, chosen once at start (``init_distributed``)."""

    device: torch.device
    backend: str
    """The process-group backend for this device: gloo (CPU) or nccl (CUDA)."""
    param_dtype: torch.dtype
    """The compute dtype; weights, gradients' reductions and optimiser state stay float32."""
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    distributed: bool = False
    """Launched by torchrun (even with one process): this process joined its group and models are sharded.
    Not merely "a process group exists": an in-process vLLM engine starts a group of one of its own."""


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """``RunConfig.device`` to a torch device: auto is CUDA when present, else the CPU; a bare ``cuda``
    under torchrun is the GPU of this rank's LOCAL_RANK."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        name = f"cuda:{local_rank}"
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"device {name!r} was asked for, but this machine has no CUDA device")
    return device


def init_distributed(device: str = "auto", timeout_s: float | None = None) -> Placement:
    """Pick device, backend and dtype; join torchrun's process group when launched by it. A collective
    that waits longer than ``timeout_s`` for another rank raises instead of hanging (``RunConfig.
    collective_timeout_s``, docs/design.md §7); None keeps the backend's default (30 minutes for gloo)."""
    rank = int(os.environ.get("RANK", 0))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    dev = resolve_device(device, local_rank)
    cuda = dev.type == "cuda"
    backend = "nccl" if cuda else "gloo"
    if cuda:
        torch.cuda.set_device(dev)
    launched = "TORCHELASTIC_RUN_ID" in os.environ or world_size > 1  # torchrun sets both
    if launched and not dist.is_initialized():
        timeout = timedelta(seconds=timeout_s) if timeout_s else None
        dist.init_process_group(backend, device_id=dev if cuda else None, timeout=timeout)
        _joined.append(True)
    dtype = torch.bfloat16 if cuda else torch.float32
    return Placement(dev, backend, dtype, rank, world_size, local_rank, launched)


def device_mesh(placement: Placement) -> DeviceMesh:
    """A 1-D mesh over every rank: pure data parallelism (FSDP)."""
    return init_device_mesh(placement.device.type, (placement.world_size,), mesh_dim_names=("dp",))


def mixed_precision(placement: Placement) -> MixedPrecisionPolicy:
    """Compute in the placement's dtype, reduce gradients in float32 (docs/design.md §7)."""
    return MixedPrecisionPolicy(param_dtype=placement.param_dtype, reduce_dtype=torch.float32)


def transformer_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder layers of a Hugging Face causal LM (``model.model.layers`` for Llama, Qwen, ...)."""
    base = getattr(model, getattr(model, "base_model_prefix", ""), model)
    layers = getattr(base, "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__} has no decoder layers at .{model.base_model_prefix}.layers")
    return list(layers)


def apply_ac(model: torch.nn.Module) -> None:
    """Activation checkpointing per transformer block. The composable API hooks each block in place, so
    parameter names (and with them checkpoints and engine syncs) stay those of the plain model."""
    from torch.distributed._composable import checkpoint

    # a KV cache would grow again when a block's forward is recomputed in the backward pass
    model.config.use_cache = False
    for block in transformer_blocks(model):
        checkpoint(block)


def apply_fsdp(model: torch.nn.Module, mesh: DeviceMesh, mp_policy: MixedPrecisionPolicy) -> None:
    """``fully_shard`` each transformer block, then the root (which keeps the embedding, the final norm
    and the head: tied embeddings must share one unit).

    Every rank's loss is its share of the full-batch loss, weighted globally, so the gradients must be
    summed over ranks, not averaged: divide factor 1, and plain sum reductions (gloo has no PREMUL_SUM).
    """
    for block in transformer_blocks(model):
        fully_shard(block, mesh=mesh, mp_policy=mp_policy)
    fully_shard(model, mesh=mesh, mp_policy=mp_policy)
    for unit in model.modules():  # each setting holds for one unit's own parameters only
        if isinstance(unit, FSDPModule):
            unit.set_gradient_divide_factor(1.0)
            unit.set_force_sum_reduction_for_comms(True)


def parallelize(model: torch.nn.Module, placement: Placement, *, activation_checkpointing: bool = False):
    """Move ``model`` (float32) to the placement's device; under torchrun shard it. Returns the model.

    Without a process group, activation checkpointing is left to the update (Hugging Face's own), and
    bfloat16 compute on CUDA comes from ``autocast``."""
    model = model.to(device=placement.device, dtype=torch.float32)
    if not placement.distributed:
        return model
    if activation_checkpointing:
        apply_ac(model)
    apply_fsdp(model, device_mesh(placement), mixed_precision(placement))
    return model


# ---- what the updates call (each is the identity on one unsharded process) ------------------------


def is_sharded(model: torch.nn.Module) -> bool:
    return isinstance(model, FSDPModule)


def model_device(model: torch.nn.Module) -> torch.device:
    """Where the model's parameters (or their local shards) live: batches go there."""
    return next(model.parameters()).device


def autocast(model: torch.nn.Module) -> contextlib.AbstractContextManager:
    """bfloat16 compute over float32 weights for an unsharded model on CUDA (a sharded one gets it from
    its ``MixedPrecisionPolicy``); nothing on the CPU, which trains in float32."""
    device = model_device(model)
    if device.type == "cuda" and not is_sharded(model):
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def enable_gradient_checkpointing(model: torch.nn.Module, enabled: bool) -> None:
    """Hugging Face's activation checkpointing for an unsharded model when ``enabled``; a sharded one got
    its checkpointing from ``parallelize`` (``apply_ac``), so nothing is added to it here."""
    if enabled and hasattr(model, "gradient_checkpointing_enable") and not is_sharded(model):
        model.gradient_checkpointing_enable()


def _rank_and_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def rank_micro_batches(
    items: Sequence[T], size: int, rank: int | None = None, world: int | None = None
) -> list[list[T]]:
    """This rank's share of ``items`` (every world_size-th, so sorted items stay balanced) in micro-batches
    of at most ``size``. Every rank gets the same number of micro-batches, some perhaps empty, because
    each forward and backward of a sharded model is a collective that all ranks must join.
    ``rank``/``world``: this process's in the process group unless given."""
    if rank is None or world is None:
        rank, world = _rank_and_world()
    mine = list(items[rank::world])
    n_mb = -(-len(items) // (world * size))  # ceil: the largest share's micro-batch count
    per = -(-len(mine) // n_mb) if n_mb else 0
    return [mine[i * per : (i + 1) * per] for i in range(n_mb)]


def trains_together(model: torch.nn.Module) -> bool:
    """Whether the whole torchrun group trains ``model`` (it is sharded): each of its forwards, backwards
    and optimiser steps is then a collective that every rank must join, never one rank on its own."""
    return is_sharded(model)


def trainers_of(model: torch.nn.Module) -> tuple[int, int]:
    """(this rank, ranks) among the processes that train ``model`` together: the whole group when it is
    sharded, this process alone when it is not (πϕ on rank 0 of a multi-process run)."""
    return _rank_and_world() if is_sharded(model) else (0, 1)


def all_sum(values: Sequence[float], model: torch.nn.Module) -> list[float]:
    """Sum plain floats over the ranks that train ``model`` (metrics and checks that must agree on all)."""
    t = torch.tensor(values, dtype=torch.float64, device=model_device(model))
    if is_sharded(model):
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.tolist()


def all_max(value: float, model: torch.nn.Module) -> float:
    t = torch.tensor([value], dtype=torch.float64, device=model_device(model))
    if is_sharded(model):
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor behind a sharded one (a collective: every rank calls it); a plain one as is."""
    return t.full_tensor() if isinstance(t, DTensor) else t


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Unsharded weights for an engine sync (a collective when sharded: every rank gets every tensor; a
    checkpoint's save takes ``main_state_dict``). Gathered one tensor at a time into host memory, so that a
    device never holds a whole model beside its shards (a 7B actor's float32 master weights are 30 GB:
    gathered on the GPU they would not fit beside the paper preset's 76 GB); on CPU that is the same
    memory."""
    if not is_sharded(model):
        return model.state_dict()
    return {name: full_tensor(t).cpu() for name, t in model.state_dict().items()}


def main_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Unsharded weights in rank 0's host memory, for the one rank that writes them (a checkpoint's Hugging
    Face folder); every other rank gets ``{}`` (a collective when sharded). Gathered to rank 0 one tensor
    at a time (``gather_to_main``): a helper rank only sends its shards, never holds a whole model beside
    them (a 7B actor's float32 weights: 30 GB of host memory a rank). A tensor under two names (a tied
    head) is gathered and kept once, under its first name, as ``save_pretrained`` keeps it."""
    if not is_sharded(model):
        return model.state_dict()
    main = is_main()
    out, seen = {}, set()
    for name, t in model.state_dict(keep_vars=True).items():  # the parameters themselves: a tied one is one
        if id(t) in seen:
            continue
        seen.add(id(t))
        whole = gather_to_main(t.detach())
        if main:
            out[name] = whole.cpu()
    return out


def gather_to_main(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor behind an FSDP2 shard (dim-0 chunks over a 1-D mesh) on rank 0; on every other rank
    its own shard, which it only sent (a collective: ``dist.gather``, so the helpers receive nothing).
    Shards are padded to the first one's rows for the gather, as ``torch.chunk`` made them."""
    if not isinstance(t, DTensor):
        return t
    mesh = t.device_mesh
    if mesh.ndim != 1 or t.placements != (Shard(0),):
        return t.full_tensor()
    local, world = t.to_local(), mesh.size()
    rows = -(-t.shape[0] // world)
    padded = local.contiguous()
    if local.shape[0] != rows:  # a short last shard, or none
        padded = local.new_zeros((rows, *t.shape[1:]))
        padded[: local.shape[0]] = local
    parts = [torch.empty_like(padded) for _ in range(world)] if is_main() else None
    dist.gather(padded, parts, dst=mesh.mesh[0].item(), group=mesh.get_group())
    return torch.cat(parts)[: t.shape[0]] if parts is not None else local


def named_full_parameters(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, whole parameter) pairs, gathered when sharded: for tests and comparisons."""
    for name, p in model.named_parameters():
        yield name, full_tensor(p.detach())


def rank() -> int:
    """This process's rank in its torchrun group (0 on its own)."""
    return _rank_and_world()[0]


def is_main() -> bool:
    """Rank 0 (or the one process): the rank that writes files, reports and talks to the database."""
    return rank() == 0


def any_rank(flag: bool) -> bool:
    """Whether ``flag`` is set on any rank: decisions that every rank must take together (stop, save)."""
    rank, world = _rank_and_world()
    if world == 1:
        return flag
    nccl = dist.get_backend() == "nccl"  # whose collectives take tensors on this rank's GPU only
    t = torch.tensor([float(flag)], device=torch.cuda.current_device() if nccl else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def owners(guided: Sequence[bool], world: int | None = None) -> list[int]:
    """Which rank plays each episode (by position; ``guided``: whether each is experience-guided).

    Every rank plays its share of the guided episodes and of the free ones, each within one of the
    balanced share: the guided episodes are dealt round the ranks from rank 0, the free ones go on dealing
    from the rank after the last guided one, so each rank's total is balanced too. Without guided episodes
    that is every world_size-th, from rank 0. Retrieval and Search-and-Ask's searches stay rank 0's whatever
    the owner (``on_rank_zero``). Every rank computes the same answer from the specs alone."""
    if world is None:
        world = _rank_and_world()[1]
    dealt = iter(range(len(guided)))
    order = {i: next(dealt) for i, g in enumerate(guided) if g}
    order |= {i: next(dealt) for i, g in enumerate(guided) if not g}
    return [order[i] % world for i in range(len(guided))]


def gather_owned(mine: list[T], owned_by: Sequence[int]) -> list[T]:
    """Every rank's results for the items it owns (``owned_by[i]``: item i's rank, ``mine``: this rank's
    in item order), back in the order of all items (a collective: ``all_gather_object``, so every rank
    holds the whole list afterwards)."""
    rank, world = _rank_and_world()
    if world == 1:
        return mine
    parts: list[list[T] | None] = [None] * world
    dist.all_gather_object(parts, mine)
    by_rank = [iter(part) for part in parts]
    return [next(by_rank[r]) for r in owned_by]


def broadcast_object(obj: T) -> T:
    """Rank 0's ``obj`` on every rank (a collective: ``broadcast_object_list``); one process: ``obj``."""
    if _rank_and_world()[1] == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def on_rank_zero(mine: list[T], owned_by: Sequence[int], serve: Callable[[list[T]], Sequence[R]]) -> list[R]:
    """``serve`` over every rank's items, called by rank 0 alone, and this rank's answers (in its items'
    order; ``owned_by[i]``: item i's rank, ``mine``: this rank's items in item order). A collective that
    every rank joins, with items or without: rank 0 makes exactly the call one process makes (the same
    items in the same order), so a stateful ``serve`` (the experience bank's retriever, whose usage counters
    steer its next answers) answers the same on any number of ranks, and writes from one process
    (docs/design.md §7). An error in ``serve`` reaches every rank. One process: ``serve(mine)``."""
    rank, world = _rank_and_world()
    if world == 1:
        return list(serve(mine))
    everything = gather_owned(mine, owned_by)
    answer: tuple[str, Any] | None = None
    if rank == 0:
        try:
            found = list(serve(everything))
            if len(found) != len(everything):
                raise ValueError(f"{len(found)} answers for {len(everything)} items")
            answer = ("ok", found)
        except Exception as exc:
            broadcast_object(("error", f"{type(exc).__name__}: {exc}"))  # the other ranks wait for it
            raise
    kind, found = broadcast_object(answer)
    if kind == "error":
        raise RuntimeError(f"rank 0 failed to serve rank {rank}'s items: {found}")
    return [x for x, r in zip(found, owned_by, strict=True) if r == rank]


def gather_values(value: T) -> list[T]:
    """Every rank's ``value``, by rank (a collective: ``all_gather_object``); one process: its own."""
    rank, world = _rank_and_world()
    if world == 1:
        return [value]
    out: list[T | None] = [None] * world
    dist.all_gather_object(out, value)
    return out  # type: ignore[return-value]


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def destroy() -> None:
    """Leave the process group ``init_distributed`` joined, at the end of a run (torchrun warns otherwise);
    a group someone else started (an in-process vLLM engine's) is theirs to end. On a normal end the caller
    meets its peers at ``barrier()`` first: a rank that tears gloo's connections down while a peer still uses
    them can abort that peer ("terminate called without an active exception", seen here at the end of a
    2-process benchmark). Not after an error: the other ranks may be inside another collective, and torchrun
    ends them anyway."""
    if _joined and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    _joined.clear()
