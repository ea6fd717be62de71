"""A DCP storage reader that reads tensor bytes straight into their destination.

DCP's `FileSystemReader` turns every stored item into a tensor with `torch.load` (a zip
archive inside the shard file), into fresh memory, then copies the needed part into the
destination: two copies and the page faults of new memory for every byte. Each stored item
is a `torch.save` archive whose tensor bytes sit uncompressed in one record. This reader
reads each archive front to back with `_formats.torch_save.read_stored`, which finds that record
(the archive's `data.pkl`, a few hundred bytes read by a restricted unpickler that accepts
nothing but the tensor-rebuild call, and its directory, which confirms it), then:

- when a read item is a whole stored chunk and its destination a contiguous CPU tensor of
  the same dtype (a resume onto the same layout: every FSDP2 shard, every optimizer
  state), reads the bytes into the destination's own memory;
- otherwise (resharding, other dtype, another device) it reads the stored chunk into one
  new tensor and copies the needed slice, as DCP does;
- anything else (byte items, storage transforms, an archive it does not recognise) goes to
  DCP's own code, unchanged.

Items are read file by file in offset order. Used by resume (`load_in_place`), by verify
and by the converter for a tensor its own reader does not take (`load_dcp_tensor`).
"""

from __future__ import annotations

import dataclasses
import io
from typing import Any

import torch
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.futures import Future

from ..fast_paths import fell_back
from ..safetensors.read import memory_of
from ..torch_save import Stored, read_stored

__all__ = ["DirectFileSystemReader"]


def _narrow(tensor: torch.Tensor, offsets: torch.Size, lengths: torch.Size) -> torch.Tensor:
    for dim, (offset, length) in enumerate(zip(offsets, lengths)):
        if offset != 0 or length != tensor.shape[dim]:
            tensor = tensor.narrow(dim, offset, length)
    return tensor


class DirectFileSystemReader(FileSystemReader):
    """`FileSystemReader` whose tensor reads go straight into the destination (see above)."""

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        super().set_up_storage_reader(metadata, is_coordinator, *args, **kwargs)
        self._stored_sizes = {
            fqn: [tuple(chunk.sizes) for chunk in entry.chunks]
            for fqn, entry in metadata.state_dict_metadata.items()
            if isinstance(entry, TensorStorageMetadata)
        }

    def _read_one(self, f: io.RawIOBase, req: ReadItem, planner: LoadPlanner) -> bool:
        info = self.storage_data[req.storage_index]
        if req.type != LoadItemType.TENSOR or info.transform_descriptors:
            return False
        index = req.storage_index.index
        sizes = self._stored_sizes.get(req.storage_index.fqn, [])
        if index is None or index >= len(sizes):
            return False
        target = planner.resolve_tensor(req).detach()
        if tuple(target.shape) != tuple(req.lengths):
            return False
        into: list[torch.Tensor] = []
        asked: list[Stored] = []

        def buffer_for(stored: Stored) -> memoryview | None:
            """The destination's own memory when the item is a whole stored chunk of its dtype
            and it is a contiguous CPU tensor, else a new tensor the size of the chunk."""
            asked.append(stored)
            if stored.shape != sizes[index]:
                return None
            dtype = getattr(torch, stored.dtype)
            whole = all(o == 0 for o in req.storage_offsets) and tuple(req.lengths) == stored.shape
            direct = whole and target.device.type == "cpu" and target.dtype == dtype and target.is_contiguous()
            into[:] = [target if direct else torch.empty(stored.shape, dtype=dtype)]
            return memory_of(into[0])

        if read_stored(f.fileno(), info.offset, info.length, buffer_for) is None:
            if not asked:  # no buffer was asked for: an archive read_stored does not recognise
                fell_back(self.fs.concat_path(self.path, info.relative_path))
            return False
        if into[0] is not target:
            target.copy_(_narrow(into[0], req.storage_offsets, req.lengths))
        planner.commit_tensor(req, target)
        return True

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        per_file: dict[str, list[ReadItem]] = {}
        for req in plan.items:
            per_file.setdefault(self.storage_data[req.storage_index].relative_path, []).append(req)
        rest: list[ReadItem] = []
        for relative_path, reqs in per_file.items():
            path = self.fs.concat_path(self.path, relative_path)
            with open(path, "rb", buffering=0) as f:
                for req in sorted(reqs, key=lambda r: self.storage_data[r.storage_index].offset):
                    if not self._read_one(f, req, planner):
                        rest.append(req)
        if rest:
            return super().read_data(dataclasses.replace(plan, items=rest), planner)
        done: Future[None] = Future()
        done.set_result(None)
        return done
