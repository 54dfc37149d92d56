"""The policy's weights in bounded buckets: how a weight push leaves the trainer and lands in a sampler.

``policy_tensors`` yields the trainer model's HF-named tensors one at a time (LoRA adapters merged into their base
weight; under FSDP2 each parameter's ``full_tensor()``, a collective every rank runs in the same order, so no rank
ever holds more than one full parameter beyond its shard). ``pack`` casts them into flat byte buffers of at most
``bucket_bytes`` (a tensor larger than that is a bucket of its own), one ``Bucket`` each; ``unpack`` reads a
bucket's tensors back as views of its buffer, and ``load_bucket`` copies them into a module's parameters.

A bucket's buffer is a numpy array, so Ray puts it into the object store without pickling it and a receiver reads
it in place (zero-copy): the bytes are copied once into the store and once into the sampler's parameters.

A LoRA run pushes the adapters alone after its first full push where the sampler keeps a base copy (hf):
``adapter_tensors`` yields each adapted layer's A and B as one float32 tensor, packed into buckets that carry the
LoRA scaling, and ``LoraBase`` (the sampler's copy of the adapted layers' base weights, taken before any push) merges
them as the full push does, ``W + scaling * B @ A``.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from tracerl.actors.config import TrainerConfig
from tracerl.models.wrap import _PEFT_PREFIX, lora_scaling, unwrap

_ALIGN = 64
"""Byte alignment of each tensor in a bucket (any dtype's view of the buffer is aligned)."""
_LORA_A, _LORA_B = ".lora_A.default.weight", ".lora_B.default.weight"
"""peft's names of a layer's adapter matrices (its default adapter)."""


@dataclass
class Bucket:
    """Some of the policy's tensors, packed: ``names[i]`` is ``data[offsets[i]:]`` as ``dtypes[i]`` of
    ``shapes[i]``."""

    index: int
    names: list[str] = field(default_factory=list)
    shapes: list[tuple[int, ...]] = field(default_factory=list)
    dtypes: list[str] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    data: Any = None
    """A flat uint8 numpy array (read-only where it came out of the object store)."""
    lora_scaling: float | None = None
    """None: the tensors are weights, copied in. A float: LoRA adapters (``adapter_tensors``), merged into the
    sampler's base copy with this scaling (``LoraBase``)."""

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes) if self.data is not None else 0


def _full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a (possibly FSDP2-sharded) parameter: a collective for a DTensor."""
    full = getattr(t, "full_tensor", None)
    return (full() if full is not None else t).detach()


def policy_tensors(model: torch.nn.Module, trainer: TrainerConfig) -> Iterator[tuple[str, torch.Tensor]]:
    """The trainer model's tensors under the architecture's own names, one at a time, LoRA adapters merged
    (``W + scaling * B @ A``, as ``wrap.merge_lora``). Every rank of an FSDP model must iterate it to the end."""
    state = unwrap(model).state_dict()
    scaling = lora_scaling(trainer) if trainer.lora_rank > 0 else 0.0
    for key, value in state.items():
        if ".lora_" in key:
            continue  # merged into its base weight
        name = key[len(_PEFT_PREFIX) :] if key.startswith(_PEFT_PREFIX) else key
        if ".base_layer." not in name:
            yield name, _full(value)
            continue
        module, _, leaf = name.replace(".base_layer.", ".\0").partition("\0")
        full = _full(value)
        stem = key.rsplit(".base_layer.", 1)[0]
        a, b = state.get(f"{stem}.lora_A.default.weight"), state.get(f"{stem}.lora_B.default.weight")
        if leaf == "weight" and a is not None and b is not None:
            full = (full.float() + scaling * (_full(b).float() @ _full(a).float())).to(full.dtype)
        yield module + leaf, full


def adapter_tensors(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """A LoRA trainer model's adapters, one tensor per adapted layer: ``<layer>.lora`` (the architecture's own layer
    name) holding A (rank x in) then B (out x rank), flattened, in float32, so one bucket always holds a layer's
    pair. Every rank of an FSDP model must iterate it to the end (each A and B is a ``full_tensor()``)."""
    state = unwrap(model).state_dict()
    for key, a in state.items():
        if not key.endswith(_LORA_A):
            continue
        stem = key[: -len(_LORA_A)]
        b = state[stem + _LORA_B]
        name = stem[len(_PEFT_PREFIX) :] if stem.startswith(_PEFT_PREFIX) else stem
        yield f"{name}.lora", torch.cat([_full(a).float().reshape(-1), _full(b).float().reshape(-1)])


def pack(
    tensors: Iterable[tuple[str, torch.Tensor]],
    dtype: torch.dtype,
    bucket_bytes: int,
    lora_scaling: float | None = None,
) -> Iterator[Bucket]:
    """``tensors`` (floating point ones cast to ``dtype``) in buckets of at most ``bucket_bytes`` each (a larger
    tensor alone in its own). A tensor is cast straight into the bucket's buffer: nothing else is copied.
    ``lora_scaling``: the tensors are ``adapter_tensors`` of a LoRA run with this scaling."""
    buf: torch.Tensor | None = None
    bucket, used, index = Bucket(0, lora_scaling=lora_scaling), 0, 0
    for name, t in tensors:
        out = dtype if t.is_floating_point() else t.dtype
        size = t.numel() * out.itemsize
        if buf is not None and used + size > buf.numel():
            bucket.data = buf[:used].numpy()
            yield bucket
            index += 1
            buf, bucket, used = None, Bucket(index, lora_scaling=lora_scaling), 0
        if buf is None:
            buf = torch.empty(max(bucket_bytes, size), dtype=torch.uint8)
        buf[used : used + size].view(out).view(t.shape).copy_(t)
        bucket.names.append(name)
        bucket.shapes.append(tuple(t.shape))
        bucket.dtypes.append(str(out).removeprefix("torch."))
        bucket.offsets.append(used)
        used += -(-size // _ALIGN) * _ALIGN
    if buf is not None:
        bucket.data = buf[:used].numpy()
        yield bucket


def batched(
    tensors: Iterable[tuple[str, torch.Tensor]], dtype: torch.dtype, bucket_bytes: int
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """``tensors`` (floating point ones cast to ``dtype`` where they are: a GPU tensor stays on its GPU) in lists of
    at most ``bucket_bytes`` (a larger tensor alone): the batches of a collective push (tracerl/actors/collective.py)."""
    batch: list[tuple[str, torch.Tensor]] = []
    used = 0
    for name, t in tensors:
        out = t.to(dtype) if t.is_floating_point() else t
        size = out.numel() * out.element_size()
        if batch and used + size > bucket_bytes:
            yield batch
            batch, used = [], 0
        batch.append((name, out))
        used += size
    if batch:
        yield batch


def unpack(bucket: Bucket) -> list[tuple[str, torch.Tensor]]:
    """The bucket's tensors as views of its buffer (read-only when it came out of the object store: copy them)."""
    with warnings.catch_warnings():  # a read-only buffer out of the object store: only ever read here
        warnings.simplefilter("ignore", UserWarning)
        flat = torch.from_numpy(np.asarray(bucket.data))
    out = []
    for name, shape, dt, off in zip(bucket.names, bucket.shapes, bucket.dtypes, bucket.offsets):
        dtype = getattr(torch, dt)
        n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        out.append((name, flat[off : off + n].view(dtype).view(shape)))
    return out


def load_bucket(module: torch.nn.Module, bucket: Bucket) -> None:
    """Copy a bucket's tensors into ``module``'s parameters and buffers of the same names.

    Raises:
        KeyError: a name the module does not have (the pushed policy is another architecture)."""
    state = module.state_dict(keep_vars=True)
    unknown = [n for n in bucket.names if n not in state]
    if unknown:
        raise KeyError(f"the pushed weights name {unknown[:3]} which this sampler's model does not have")
    with torch.no_grad():
        for name, t in unpack(bucket):
            state[name].data.copy_(t)


def export(module: torch.nn.Module, index: int, bucket_bytes: int) -> Bucket | None:
    """Bucket ``index`` of ``module``'s own weights as ``pack`` makes them in their own dtypes (None past the
    last): a replaced sampler copies a live one's weights this way."""
    for b in pack(((k, v.detach()) for k, v in module.state_dict().items()), _dtype(module), bucket_bytes):
        if b.index == index:
            return b
    return None


def _dtype(module: torch.nn.Module) -> torch.dtype:
    return next(module.parameters()).dtype


class LoraBase:
    """A sampler's copy of the base weights of the layers a LoRA run adapts, taken from its model before any push
    (a LoRA run's base weights are frozen: ``model.path``'s, as the sampler loaded them), into which pushed adapters
    are merged: ``W = base + scaling * B @ A``, computed as ``policy_tensors`` computes it (float32, then the
    model's dtype). Where the sampler runs in float32, or the checkpoint's weights are already in the sampler's
    dtype, that is the full push's value; a float32 checkpoint run in bfloat16 rounds the base before the sum
    instead of after it (one rounding apart)."""

    def __init__(self, module: torch.nn.Module, targets: Iterable[str]) -> None:
        """Copy the weights of ``module``'s layers named by ``targets`` (as ``trainer.lora_targets``: a layer whose
        name is a target or ends with ``.target``, as peft matches them)."""
        names = tuple(targets)
        self.base = {
            n: m.weight.detach().clone()
            for n, m in module.named_modules()
            if any(n == t or n.endswith("." + t) for t in names)
            and isinstance(getattr(m, "weight", None), torch.Tensor)
        }

    def load(self, module: torch.nn.Module, bucket: Bucket) -> None:
        """Merge a bucket of adapters (``adapter_tensors``, ``bucket.lora_scaling``) into ``module``'s weights.

        Raises:
            KeyError: an adapter for a layer this copy does not hold (trainer.lora_targets differ from the
                sampler's)."""
        scaling = float(bucket.lora_scaling or 0.0)
        with torch.no_grad():
            for name, flat in unpack(bucket):
                layer = name.removesuffix(".lora")
                base = self.base.get(layer)
                if base is None:
                    raise KeyError(
                        f"a LoRA push adapts {layer!r}, of which this sampler keeps no base copy (it keeps "
                        f"{len(self.base)} layers): the sampler's lora targets must be trainer.lora_targets"
                    )
                out, inp = base.shape
                rank = flat.numel() // (inp + out)
                if rank * (inp + out) != flat.numel():
                    raise ValueError(f"the adapters of {layer!r} do not fit its {out} x {inp} weight")
                a, b = flat[: rank * inp].view(rank, inp), flat[rank * inp :].view(out, rank)
                merged = (base.float() + scaling * (b.float() @ a.float())).to(base.dtype)
                weight = module.get_submodule(layer).weight
                assert isinstance(weight, torch.Tensor)
                weight.data.copy_(merged)
