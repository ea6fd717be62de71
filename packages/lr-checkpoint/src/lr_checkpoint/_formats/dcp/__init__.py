"""DCP shard folders: `metadata` (restricted parse, no torch), `read` (DCP loads after that
parse), `direct` (resume's reader into the destination tensors), `stream` (the converter's
byte-range reader, no torch), `write` (the shard writer with writeback)."""
