"""The files of a checkpoint, byte by byte: safetensors, DCP shards and their metadata, the
`torch.save` archives inside DCP items, dtype casts of raw bytes, the small JSON files, and the
switch of the fast readers of torch's private formats.

Kept empty: several of these modules run without torch (the converter, `inspect`), so
nothing here is imported until a module asks for it.
"""
