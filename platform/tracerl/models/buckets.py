"""The policy's weights in bounded buckets: how a weight push leaves the trainer and lands in a sampler.

``policy_tensors`` yields the trainer model's HF-named tensors one at a time (LoRA adapters merged into their base
weight; under FSDP2 each parameter's ``full_tensor()``, a collective every rank runs in the same order, so no rank
ever holds more than one full parameter beyond its shard). ``pack`` casts them into flat byte buffers of at most
``bucket_bytes`` (a tensor larger than that is a bucket of its own), one ``Bucket`` each; ``unpack`` reads a
bucket's tensors back as views of its buffer, and ``load_bucket`` copies them into a module's parameters.

A bucket's buffer is a numpy array, so Ray puts it into the object store without pickling it and a receiver reads
it in place (zero-copy): the bytes are copied once into the store and once into the sampler's parameters.
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


def pack(
    tensors: Iterable[tuple[str, torch.Tensor]], dtype: torch.dtype, bucket_bytes: int
) -> Iterator[Bucket]:
    """``tensors`` (floating point ones cast to ``dtype``) in buckets of at most ``bucket_bytes`` each (a larger
    tensor alone in its own). A tensor is cast straight into the bucket's buffer: nothing else is copied."""
    buf: torch.Tensor | None = None
    bucket, used, index = Bucket(0), 0, 0
    for name, t in tensors:
        out = dtype if t.is_floating_point() else t.dtype
        size = t.numel() * out.itemsize
        if buf is not None and used + size > buf.numel():
            bucket.data = buf[:used].numpy()
            yield bucket
            index += 1
            buf, bucket, used = None, Bucket(index), 0
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
