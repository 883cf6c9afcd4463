"""The tar format: shard bytes in, members out.

Scanning (``scan``, with the header walk in ``walk`` and ``_tarwalk.c``, which
``extensions`` loads), header
fields and extensions (``fields``, ``ext``, ``sparse``; the scan and the stream read
them through the same functions), writing headers (``header``), reading a file object
front to back (``stream``; opening URLs and pipes is ``read/``'s job), scanning a
shard as it streams past with the scanner's own steps (``streamscan``), telling
compressed shards (``compress``), and checking that a sample's span still begins with
its own headers (``spancheck``).

May import: the shared modules (``indextar.errors``).
Must not import: any other room; the format knows no sources, indexes or datasets.
"""
