"""Moving a checkpoint's bytes to and from disk: `checksums` (checksums.json of a step folder),
`hashing` (SHA-256 and CRC-32 beside the I/O), `direct_io` (O_DIRECT writes), `writeback`
(writeback started while a file is written). None of them imports torch."""
