-- indextar shard index, format version 3 (4 where it records per-sample checksums).
--
-- One SQLite file per shard, named <shard>.idx.sqlite. It is written to a temporary
-- file and renamed into place, so it is either absent or complete, and it is never
-- modified afterwards: a rebuild replaces the whole file. Safe to run twice.
--
-- Offsets are byte offsets into the uncompressed tar (of a compressed shard: into its
-- decompressed bytes; the frames and seek_points tables map them onto the file). A
-- member's header_offset is its first header block, GNU long-name or PAX extension
-- headers included, so that the bytes [samples.start_offset, samples.end_offset) are
-- themselves a valid tar stream of that sample's members.

-- Key/value facts about the shard and how the index was built (all values are TEXT):
--   format_version      this schema's version, "3" (2 added the raw_* columns, 3 the
--                       compressed shards: compression, uncompressed_size, seek_spacing,
--                       and the frames and seek_points tables); version 2 is still read.
--                       "4" for an index that records checksums (the checksum fact and
--                       the checksums array), which older readers refuse rather than
--                       read unchecked; every other index is still written as "3"
--   indextar_version    version of indextar that wrote the file
--   shard_name          the shard's file name (base name)
--   shard_size          shard size in bytes when indexed
--   shard_mtime_ns      shard modification time (ns) when indexed
--   fingerprint         blake2b-128 of the size and the first and last 64 KiB
--   end_offset          offset of the end-of-archive marker
--   num_members         rows in members
--   num_samples         rows in samples
--   num_skipped         rows in skipped
--   naming              naming rules used ("webdataset-1": see docs/format.md)
--   ignore_zeros        "1" if built with ignore_zeros (concatenated archives), else "0"
--   created             UTC time of the build, ISO 8601
--   etag                the remote object's ETag when it was indexed; "" for a local shard
--   span_names          "1" if every sample's span names its key in its own headers, so
--                       reads may check names; "0" (a global PAX header names members):
--                       reads check header checksums only (indextar/index/spans.py)
--   compression         "gzip" or "zstd" for a compressed shard; "" for a plain tar
--   uncompressed_size   size of the decompressed tar (a plain tar: 0, its size is shard_size)
--   seek_spacing        uncompressed bytes between seek points of a single-stream gzip
--                       shard (seek_points); 0 when the shard is read by frames
--   checksum            the algorithm of the per-sample checksums ("crc32" or "xxh3_64",
--                       indextar/index/checksums.py), or "" (or absent) for none
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

-- Names are bytes in a tar. A name that is not valid UTF-8 (an archive from a Latin-1
-- system) is read as Python's surrogateescape does, as tarfile and webdataset read it.
-- TEXT must be UTF-8, so its name and key columns hold it with each such byte as U+FFFD,
-- and raw_name / raw_key its exact bytes; these are NULL for every name that is UTF-8.

-- Every regular file that belongs to a sample, in archive order.
CREATE TABLE IF NOT EXISTS members (
    member_id     INTEGER PRIMARY KEY,  -- 0-based, archive order
    sample_id     INTEGER NOT NULL,     -- samples.sample_id
    name          TEXT NOT NULL,        -- full member path, UTF-8
    ext           TEXT NOT NULL,        -- extension, lowercased ("jpg", "seg.png")
    header_offset INTEGER NOT NULL,     -- first header block of the member
    data_offset   INTEGER NOT NULL,     -- first byte of the member's data
    size          INTEGER NOT NULL,     -- data size in bytes
    raw_name      BLOB                  -- the name's bytes if not UTF-8, else NULL
);

-- Consecutive members sharing a key, in archive order.
CREATE TABLE IF NOT EXISTS samples (
    sample_id    INTEGER PRIMARY KEY,   -- 0-based, archive order
    key          TEXT NOT NULL,         -- the members' common key ("__key__")
    first_member INTEGER NOT NULL,      -- members.member_id of its first member
    member_count INTEGER NOT NULL,
    start_offset INTEGER NOT NULL,      -- header_offset of its first member
    end_offset   INTEGER NOT NULL,      -- end of its last member's data, block-aligned
    raw_key      BLOB                   -- the key's bytes if not UTF-8, else NULL
);

-- Entries that belong to no sample, with the reason: directory, symlink, hardlink,
-- chardev, blockdev, fifo, meta, hidden, no-extension, ...
CREATE TABLE IF NOT EXISTS skipped (
    header_offset INTEGER PRIMARY KEY,
    name          TEXT NOT NULL,
    kind          TEXT NOT NULL,
    size          INTEGER NOT NULL,
    raw_name      BLOB                  -- the name's bytes if not UTF-8, else NULL
);

-- The reader's arrays, derived from the rows above and written in the same transaction:
-- opening a shard for random access is one SELECT here and np.frombuffer per row,
-- instead of converting every samples and members row. verify_index checks that they
-- agree with the tables; an index without this table is read from its tables.
--   samples  dtype <i8, (num_samples, 6): start_offset, end_offset, first_member,
--            member_count, key_start, key_end (the key's bytes in "keys")
--   members  dtype <i8, (num_members, 3): span_offset (data_offset - the sample's
--            start_offset), size, ext_code (position in "exts")
--   keys     dtype utf-8: every sample's key, concatenated: its raw bytes, which are UTF-8
--            unless the name was not (key.encode("utf-8", "surrogateescape"))
--   exts     dtype json: the distinct extensions, sorted, as a JSON list (ASCII; a
--            surrogate escaped as \udcXX)
--   key_lengths  dtype <u1, <u2, <u4 or <u8 (the narrowest that holds them), (num_samples,):
--            key_end - key_start of each sample, so that the keys alone are read (a join;
--            indextar/index/keyblob.py); absent from indexes written before it
--   checksums  dtype <u8, (num_samples,): only where meta.checksum names an algorithm:
--            each sample's hash of its bytes [start_offset, end_offset) (of a compressed
--            shard: its uncompressed bytes), which reads check
CREATE TABLE IF NOT EXISTS arrays (
    name    TEXT PRIMARY KEY,
    dtype   TEXT NOT NULL,     -- numpy dtype of packed numbers ("<i8"), or "utf-8" / "json"
    columns TEXT NOT NULL,     -- column names of a 2-D array, comma-separated; "" otherwise
    data    BLOB NOT NULL      -- row-major, little-endian
);

-- A compressed shard made of independent gzip members or zstd frames (a per-sample
-- shard, a multi-frame .tar.zst): every data frame, in file order. A read of
-- uncompressed bytes decompresses the frames that cover them, each whole. Empty for
-- plain tars and for shards read through seek_points.
CREATE TABLE IF NOT EXISTS frames (
    frame_id            INTEGER PRIMARY KEY,  -- 0-based, file order
    compressed_offset   INTEGER NOT NULL,     -- the frame's first byte in the file
    compressed_size     INTEGER NOT NULL,
    uncompressed_offset INTEGER NOT NULL,     -- where its bytes start in the tar
    uncompressed_size   INTEGER NOT NULL
);

-- A single-stream gzip shard (tar czf): zlib's zran seek points, about one every
-- meta.seek_spacing uncompressed bytes. Decompression may resume at a point given the
-- window of uncompressed data before it.
CREATE TABLE IF NOT EXISTS seek_points (
    point_id            INTEGER PRIMARY KEY,  -- 0-based, stream order
    compressed_offset   INTEGER NOT NULL,     -- the byte where deflate data resumes
    bits                INTEGER NOT NULL,     -- bits (0-7) of the byte before it that belong
                                              -- to the point's first deflate code
    uncompressed_offset INTEGER NOT NULL,
    window              BLOB                  -- the 32 KiB of uncompressed data before the
                                              -- point, zlib-compressed; NULL where none is
                                              -- needed (a gzip member's start)
);

-- Indexes: created after the bulk insert (indextar splits this file at the next line).
-- @indexes
CREATE INDEX IF NOT EXISTS samples_by_key ON samples (key);
